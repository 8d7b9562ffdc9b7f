use super::*;

const QUIET: f64 = 300.0;

fn fail(code: i32, text: &str) -> Failure {
    Failure {
        code,
        text: text.into(),
    }
}

fn unknown() -> Failure {
    fail(999, "Unknown Error (999)")
}

fn state(j: &Judge) -> (State, Option<String>, bool) {
    (
        j.health.state,
        j.health.cause.map(|c| c.slug()),
        j.health.lost,
    )
}

#[test]
fn a_new_gpu_is_healthy_and_stays_so_while_it_answers() {
    let mut j = Judge::new(100.0, QUIET);
    assert_eq!(j.health(), &Health::healthy(100.0));
    for t in 0..100 {
        let now = 100.0 + f64::from(t) * 30.0;
        for a in [
            Answer::Alive,
            Answer::RetiredPages { pending: false },
            Answer::RemappedRows {
                pending: false,
                failure: false,
            },
            Answer::Ecc { uncorrected: 0 },
        ] {
            assert_eq!(j.observe(&Input::Answered(a), now), None);
        }
        assert_eq!(j.settle(now + 1.0), None);
    }
    assert_eq!(j.health().state, State::Healthy);
    assert_eq!(j.health().since_unix, 100.0);
}

#[test]
fn each_xid_class_does_what_it_says() {
    // Lost: unhealthy and lost.
    let mut j = Judge::new(0.0, QUIET);
    let c = j.observe(&Input::Xid(79), 10.0).expect("a change");
    assert_eq!(c.from.state, State::Healthy);
    assert_eq!(
        c.to,
        Health {
            state: State::Unhealthy,
            cause: Some(Cause::Xid(79)),
            reason: Some("XID 79: the GPU has fallen off the bus".into()),
            since_unix: 10.0,
            lost: true,
        }
    );
    // Unhealthy, not lost.
    for x in [48, 62, 64, 74, 95, 119, 120, 140] {
        let mut j = Judge::new(0.0, QUIET);
        j.observe(&Input::Xid(x), 5.0);
        assert_eq!(
            state(&j),
            (State::Unhealthy, Some(format!("xid-{x}")), false),
            "XID {x}"
        );
        assert!(
            j.health()
                .reason
                .as_deref()
                .is_some_and(|r| r.starts_with(&format!("XID {x}: "))),
            "{:?}",
            j.health()
        );
    }
    // Degraded.
    for x in [63, 92, 94, 154] {
        let mut j = Judge::new(0.0, QUIET);
        j.observe(&Input::Xid(x), 5.0);
        assert_eq!(
            state(&j),
            (State::Degraded, Some(format!("xid-{x}")), false),
            "XID {x}"
        );
    }
    // Application errors and unclassified XIDs take nothing out, but
    // the last is kept for display.
    for x in [13, 31, 43, 45, 68, 1, 109, 999] {
        let mut j = Judge::new(0.0, QUIET);
        assert_eq!(j.observe(&Input::Xid(x), 5.0), None, "XID {x}");
        assert_eq!(j.health().state, State::Healthy);
        assert_eq!(j.ignored_xid, Some((x, 5.0)));
    }
    // A double-bit ECC event.
    let mut j = Judge::new(0.0, QUIET);
    j.observe(&Input::DoubleBitEcc, 1.0);
    assert_eq!(
        state(&j),
        (State::Unhealthy, Some("double-bit-ecc".into()), false)
    );
}

#[test]
fn no_flapping_back_to_healthy_inside_the_quiet_period() {
    let mut j = Judge::new(0.0, QUIET);
    j.observe(&Input::Xid(48), 1000.0);
    // The GPU answers every check afterwards: still unhealthy until
    // the quiet period has passed since the XID.
    for k in 1..60 {
        let t = 1000.0 + f64::from(k) * 5.0;
        assert_eq!(j.observe(&Input::Answered(Answer::Alive), t), None, "{t}");
        assert_eq!(j.settle(t), None);
        assert_eq!(j.health().state, State::Unhealthy, "{t}");
    }
    assert_eq!(j.settle(1000.0 + QUIET - 0.001), None);
    let c = j.settle(1000.0 + QUIET).expect("back");
    assert_eq!(c.to, Health::healthy(1000.0 + QUIET));
    // A second XID inside the period starts it again.
    let mut j = Judge::new(0.0, QUIET);
    j.observe(&Input::Xid(48), 0.0);
    assert_eq!(j.observe(&Input::Xid(48), 200.0), None);
    assert_eq!(j.settle(QUIET + 1.0), None);
    assert_eq!(j.health().state, State::Unhealthy);
    assert_eq!(j.health().since_unix, 0.0);
    assert!(j.settle(200.0 + QUIET).is_some());
    // An XID every so often, closer than the quiet period, keeps it out
    // for ever.
    let mut j = Judge::new(0.0, QUIET);
    for k in 0..50 {
        j.observe(&Input::Xid(119), f64::from(k) * (QUIET - 1.0));
        assert_eq!(j.health().state, State::Unhealthy);
    }
}

#[test]
fn it_steps_down_to_degraded_while_a_degraded_condition_persists() {
    let mut j = Judge::new(0.0, QUIET);
    j.observe(&Input::Xid(48), 0.0);
    let pending = Input::Answered(Answer::RemappedRows {
        pending: true,
        failure: false,
    });
    let mut t = 0.0;
    while t <= 2.0 * QUIET {
        j.observe(&pending, t);
        t += 30.0;
    }
    assert_eq!(
        state(&j),
        (State::Degraded, Some("row-remap-pending".into()), false)
    );
    assert_eq!(j.health().since_unix, QUIET);
    // The reset happened: no longer pending; healthy a quiet period
    // after it was last seen.
    let last = t - 30.0;
    let ok = Input::Answered(Answer::RemappedRows {
        pending: false,
        failure: false,
    });
    j.observe(&ok, t);
    assert_eq!(j.health().state, State::Degraded);
    assert!(j.settle(last + QUIET).is_some());
    assert_eq!(j.health().state, State::Healthy);
}

#[test]
fn a_lost_gpu_is_unhealthy_and_lost_whatever_was_asked() {
    for check in [Check::Alive, Check::Ecc, Check::RemappedRows, Check::Events] {
        let mut j = Judge::new(0.0, QUIET);
        let c = j
            .observe(&Input::Failed(check, fail(15, "GPU is lost (15)")), 3.0)
            .expect("a change");
        assert_eq!(
            (c.to.state, c.to.cause, c.to.lost),
            (State::Unhealthy, Some(Cause::Lost), true)
        );
        assert_eq!(
            c.to.reason.as_deref(),
            Some(format!(
                "{}: GPU is lost (15): the GPU has fallen off the bus or is otherwise inaccessible",
                check.call()
            ))
            .as_deref()
        );
    }
    // Still lost while it keeps failing; not lost any more once it
    // answers (a reset), then healthy after the quiet period.
    let mut j = Judge::new(0.0, QUIET);
    let lost = Input::Failed(Check::Alive, fail(15, "GPU is lost (15)"));
    for t in [0.0, 5.0, 10.0] {
        j.observe(&lost, t);
    }
    j.observe(&Input::Answered(Answer::Alive), 15.0);
    assert_eq!(state(&j), (State::Unhealthy, Some("lost".into()), true));
    assert!(j.settle(10.0 + QUIET).is_some());
    assert_eq!(j.health().state, State::Healthy);
}

#[test]
fn a_query_failing_where_it_answered_is_unhealthy_where_it_never_did_degraded() {
    let mut answering = Judge::new(0.0, QUIET);
    answering.observe(
        &Input::Answered(Answer::RemappedRows {
            pending: false,
            failure: false,
        }),
        1.0,
    );
    answering.observe(&Input::Failed(Check::RemappedRows, unknown()), 31.0);
    assert_eq!(
        state(&answering),
        (State::Unhealthy, Some("query-failed".into()), false)
    );
    assert_eq!(
        answering.health().reason.as_deref(),
        Some("nvmlDeviceGetRemappedRows fails (Unknown Error (999)) where it answered before")
    );
    let mut never = Judge::new(0.0, QUIET);
    never.observe(&Input::Failed(Check::RemappedRows, unknown()), 1.0);
    assert_eq!(
        state(&never),
        (State::Degraded, Some("never-answered".into()), false)
    );
    assert_eq!(
        never.health().reason.as_deref(),
        Some("nvmlDeviceGetRemappedRows has never answered (Unknown Error (999))")
    );
    // The liveness query is expected of every GPU: unhealthy either way.
    let mut j = Judge::new(0.0, QUIET);
    j.observe(&Input::Failed(Check::Alive, unknown()), 1.0);
    assert_eq!(
        state(&j),
        (State::Unhealthy, Some("query-failed".into()), false)
    );
    // What a GPU cannot check, or not now, is no sign of sickness.
    for code in [3, 4, 10, 13] {
        let mut j = Judge::new(0.0, QUIET);
        j.observe(&Input::Answered(Answer::Ecc { uncorrected: 0 }), 0.0);
        for check in [Check::Alive, Check::Ecc, Check::Events] {
            assert_eq!(
                j.observe(&Input::Failed(check, fail(code, "x")), 1.0),
                None,
                "{code}"
            );
        }
    }
}

#[test]
fn memory_checks_judge_retirement_remapping_and_ecc() {
    let at = |a: Answer| {
        let mut j = Judge::new(0.0, QUIET);
        j.observe(&Input::Answered(a), 1.0);
        state(&j)
    };
    assert_eq!(
        at(Answer::RetiredPages { pending: true }),
        (State::Degraded, Some("retired-pages-pending".into()), false)
    );
    assert_eq!(
        at(Answer::RemappedRows {
            pending: false,
            failure: true
        }),
        (State::Unhealthy, Some("row-remap-failure".into()), false)
    );
    assert_eq!(
        at(Answer::RemappedRows {
            pending: true,
            failure: true
        }),
        (State::Unhealthy, Some("row-remap-failure".into()), false)
    );
    assert_eq!(
        at(Answer::Ecc { uncorrected: 3 }),
        (State::Degraded, Some("ecc-uncorrected".into()), false)
    );
    // The count rising while watched: unhealthy; the same count again
    // is no new error.
    let mut j = Judge::new(0.0, QUIET);
    j.observe(&Input::Answered(Answer::Ecc { uncorrected: 0 }), 0.0);
    assert_eq!(j.health().state, State::Healthy);
    j.observe(&Input::Answered(Answer::Ecc { uncorrected: 3 }), 30.0);
    assert_eq!(
        state(&j),
        (State::Unhealthy, Some("ecc-uncorrected".into()), false)
    );
    assert_eq!(
        j.health().reason.as_deref(),
        Some("uncorrectable ECC errors since the driver loaded rose from 0 to 3")
    );
    let mut t = 60.0;
    while t < 30.0 + QUIET + 60.0 {
        j.observe(&Input::Answered(Answer::Ecc { uncorrected: 3 }), t);
        t += 30.0;
    }
    assert_eq!(
        state(&j),
        (State::Degraded, Some("ecc-uncorrected".into()), false)
    );
}

#[test]
fn an_operator_clear_returns_it_at_once_unless_seen_again() {
    let mut j = Judge::new(0.0, QUIET);
    j.observe(&Input::Xid(79), 10.0);
    let c = j.clear(20.0, 21.0).expect("a change");
    assert_eq!(c.to, Health::healthy(21.0));
    // Applied once: the same clear again does nothing, an older one
    // neither.
    j.observe(&Input::Xid(48), 30.0);
    assert_eq!(j.clear(20.0, 31.0), None);
    assert_eq!(j.clear(15.0, 31.0), None);
    assert_eq!(j.health().state, State::Unhealthy);
    // A clear forgets only what was seen up to its time.
    let mut j = Judge::new(0.0, QUIET);
    j.observe(&Input::Xid(48), 10.0);
    j.observe(&Input::Xid(64), 30.0);
    assert_eq!(j.clear(20.0, 31.0), None);
    assert_eq!(j.health().cause, Some(Cause::Xid(64)));
    // A condition that persists is seen again at the next check.
    let mut j = Judge::new(0.0, QUIET);
    let failed = Input::Answered(Answer::RemappedRows {
        pending: false,
        failure: true,
    });
    j.observe(&failed, 10.0);
    j.clear(11.0, 11.0);
    assert_eq!(j.health().state, State::Healthy);
    j.observe(&failed, 40.0);
    assert_eq!(j.health().state, State::Unhealthy);
}

#[test]
fn a_new_wording_of_the_same_cause_is_no_change() {
    let mut j = Judge::new(0.0, QUIET);
    j.observe(&Input::Answered(Answer::Ecc { uncorrected: 2 }), 0.0);
    assert_eq!(
        j.observe(&Input::Answered(Answer::Ecc { uncorrected: 2 }), 30.0),
        None
    );
    // Rising makes it unhealthy (a change); the reason follows the
    // latest reading.
    assert!(
        j.observe(&Input::Answered(Answer::Ecc { uncorrected: 5 }), 60.0)
            .is_some()
    );
    assert_eq!(
        j.observe(&Input::Answered(Answer::Ecc { uncorrected: 7 }), 90.0),
        None
    );
    assert_eq!(
        j.health().reason.as_deref(),
        Some("uncorrectable ECC errors since the driver loaded rose from 5 to 7")
    );
    assert_eq!(j.health().since_unix, 60.0);
}

#[test]
fn times_read_as_people_write_them() {
    assert_eq!(utc(0.0), "1970-01-01T00:00:00Z");
    assert_eq!(utc(951_782_400.0), "2000-02-29T00:00:00Z");
    assert_eq!(utc(1_795_003_445.9), "2026-11-18T12:04:05Z");
    assert_eq!(utc(4_107_542_399.0), "2100-02-28T23:59:59Z");
    assert_eq!(ago(45.2), "45s");
    assert_eq!(ago(192.0), "3m12s");
    assert_eq!(ago(7500.0), "2h05m");
    assert_eq!(ago(273_600.0), "3d04h");
}

#[test]
fn a_judge_survives_being_written_and_read_back() {
    let mut j = Judge::new(0.0, QUIET);
    j.observe(&Input::Answered(Answer::Alive), 1.0);
    j.observe(&Input::Xid(79), 2.0);
    j.observe(&Input::Xid(13), 3.0);
    let text = serde_json::to_string(&j).expect("json");
    let back: Judge = serde_json::from_str(&text).expect("parses");
    assert_eq!(back, j);
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(v["health"]["state"], "unhealthy");
    assert_eq!(v["health"]["cause"], "xid-79");
    for c in [
        Cause::Xid(48),
        Cause::DoubleBitEcc,
        Cause::Lost,
        Cause::QueryFailed,
        Cause::NeverAnswered,
        Cause::RetiredPagesPending,
        Cause::RowRemapPending,
        Cause::RowRemapFailure,
        Cause::EccUncorrected,
    ] {
        assert_eq!(c.slug().parse::<Cause>(), Ok(c));
    }
    assert!("xid-x".parse::<Cause>().is_err());
    assert!("sick".parse::<Cause>().is_err());
}
