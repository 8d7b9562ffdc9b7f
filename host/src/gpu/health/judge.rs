//! The one health judgement of a GPU: a pure state machine. What NVML said
//! (an XID event, a query's answer or failure, each with its time) goes
//! in; out comes the GPU's [`Health`]: healthy, degraded or unhealthy, the
//! cause and reason, and since when. No NVML, no clock, no file here: the
//! health source (`super::source`), the one-shot look of short-lived
//! commands (`super::probe`) and the tests feed it.
//!
//! The rules:
//!
//! - An XID counts by its class ([`xid_class`]): *lost* (79: the GPU fell
//!   off the bus) and *unhealthy* XIDs take the GPU out of service,
//!   *degraded* ones are shown but leave it in, the others (application
//!   errors such as 13, 31, 43, 45, 68, and XIDs cuslice does not classify)
//!   change nothing.
//! - A query's failure counts by NVML's code ([`failure_kind`]):
//!   `GPU_IS_LOST` makes the GPU unhealthy and lost, whatever was asked;
//!   not supported, no permission, a missing function or a timeout are no
//!   sign of sickness (the check is not made). Any other failure (unknown
//!   error, reset required, ...) of the liveness query, which every GPU
//!   answers, makes it unhealthy; of another check, unhealthy where that
//!   check answered before on this GPU, degraded where it never did (a
//!   driver or GPU that cannot answer it is not a sick GPU).
//! - The memory checks: a row remapping that failed is unhealthy; pending
//!   page retirement, a pending row remapping, and uncorrectable ECC
//!   errors since the driver loaded are degraded; the uncorrectable count
//!   rising while watched is unhealthy.
//! - No flapping: a GPU stays at the worst state it was judged at until a
//!   quiet period (`quiet`, seconds) has passed with nothing of that
//!   severity seen; a condition that persists is seen again at every check,
//!   so it holds the GPU where it is. Only then does it step down (to
//!   degraded if that is still seen, else healthy). An operator's clear
//!   ([`Judge::clear`]) forgets what was seen up to its time at once.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A GPU's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// In service.
    Healthy,
    /// In service, with something an operator should see.
    Degraded,
    /// Out of service: no new work is placed on it.
    Unhealthy,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Healthy => "healthy",
            State::Degraded => "degraded",
            State::Unhealthy => "unhealthy",
        }
    }

    /// 0, 1, 2: the exporter's `cuslice_gpu_health`.
    pub fn code(self) -> u8 {
        match self {
            State::Healthy => 0,
            State::Degraded => 1,
            State::Unhealthy => 2,
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What made a GPU degraded or unhealthy. Written as a short slug
/// (`xid-79`, `lost`, ...): the DRA taint's value, the JSON's `cause`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cause {
    /// An XID event of a class that counts.
    Xid(u64),
    /// NVML's double-bit ECC event.
    DoubleBitEcc,
    /// A query answered `GPU_IS_LOST`.
    Lost,
    /// A query fails that the GPU answered before (or the liveness query).
    QueryFailed,
    /// A check has never answered on this GPU.
    NeverAnswered,
    RetiredPagesPending,
    RowRemapPending,
    RowRemapFailure,
    /// Uncorrectable ECC errors since the driver loaded.
    EccUncorrected,
}

impl Cause {
    pub fn slug(&self) -> String {
        match self {
            Cause::Xid(n) => format!("xid-{n}"),
            Cause::DoubleBitEcc => "double-bit-ecc".into(),
            Cause::Lost => "lost".into(),
            Cause::QueryFailed => "query-failed".into(),
            Cause::NeverAnswered => "never-answered".into(),
            Cause::RetiredPagesPending => "retired-pages-pending".into(),
            Cause::RowRemapPending => "row-remap-pending".into(),
            Cause::RowRemapFailure => "row-remap-failure".into(),
            Cause::EccUncorrected => "ecc-uncorrected".into(),
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.slug())
    }
}

impl FromStr for Cause {
    type Err = String;

    fn from_str(s: &str) -> Result<Cause, String> {
        if let Some(n) = s.strip_prefix("xid-") {
            return n
                .parse()
                .map(Cause::Xid)
                .map_err(|_| format!("cause {s:?}: expected xid-<number>"));
        }
        Ok(match s {
            "double-bit-ecc" => Cause::DoubleBitEcc,
            "lost" => Cause::Lost,
            "query-failed" => Cause::QueryFailed,
            "never-answered" => Cause::NeverAnswered,
            "retired-pages-pending" => Cause::RetiredPagesPending,
            "row-remap-pending" => Cause::RowRemapPending,
            "row-remap-failure" => Cause::RowRemapFailure,
            "ecc-uncorrected" => Cause::EccUncorrected,
            _ => return Err(format!("cause {s:?}: unknown")),
        })
    }
}

impl Serialize for Cause {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Cause {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// What an XID does to a GPU's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XidClass {
    /// The GPU is gone: unhealthy, and lost (its work is evicted).
    Lost,
    /// Out of service until the quiet period passes (or an operator
    /// clears it): the GPU needs a reset or service.
    Unhealthy,
    /// Shown, left in service.
    Degraded,
    /// Changes nothing: an application's error, or an XID cuslice does not
    /// classify.
    Ignored,
}

/// The XIDs cuslice classifies, with what each is (from NVIDIA's XID
/// catalog; docs/observability.md, *GPU health*, says why each class).
const XIDS: &[(u64, XidClass, &str)] = &[
    (
        13,
        XidClass::Ignored,
        "graphics engine exception (an application error)",
    ),
    (
        31,
        XidClass::Ignored,
        "GPU memory page fault (an application error)",
    ),
    (
        43,
        XidClass::Ignored,
        "GPU stopped processing (an application's fault)",
    ),
    (
        45,
        XidClass::Ignored,
        "preemptive cleanup after earlier errors",
    ),
    (
        48,
        XidClass::Unhealthy,
        "double-bit ECC error (uncorrectable memory error)",
    ),
    (62, XidClass::Unhealthy, "internal micro-controller halt"),
    (
        63,
        XidClass::Degraded,
        "page retirement or row remapping recorded: it takes effect at the next GPU reset",
    ),
    (
        64,
        XidClass::Unhealthy,
        "page retirement or row remapping failed",
    ),
    (
        68,
        XidClass::Ignored,
        "video processor exception (an application error)",
    ),
    (74, XidClass::Unhealthy, "NVLink error"),
    (79, XidClass::Lost, "the GPU has fallen off the bus"),
    (92, XidClass::Degraded, "high single-bit ECC error rate"),
    (
        94,
        XidClass::Degraded,
        "contained ECC error: the application that met it was stopped, the GPU goes on",
    ),
    (95, XidClass::Unhealthy, "uncontained ECC error"),
    (
        119,
        XidClass::Unhealthy,
        "GSP RPC timeout: the GPU's system processor stopped answering",
    ),
    (120, XidClass::Unhealthy, "GSP error"),
    (140, XidClass::Unhealthy, "unrecovered ECC error"),
    (
        154,
        XidClass::Degraded,
        "the driver changed the GPU's recovery action (a reset or reboot may be needed)",
    ),
];

/// What XID `xid` does to a GPU, and what it is.
pub fn xid_class(xid: u64) -> (XidClass, &'static str) {
    XIDS.iter().find(|(n, _, _)| *n == xid).map_or(
        (XidClass::Ignored, "not classified by cuslice"),
        |&(_, c, w)| (c, w),
    )
}

/// What was asked of NVML.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    /// The liveness query every GPU answers (its memory information).
    Alive,
    RetiredPages,
    RemappedRows,
    Ecc,
    /// Registering for its XID events.
    Events,
}

impl Check {
    /// The NVML function, for messages.
    pub fn call(self) -> &'static str {
        match self {
            Check::Alive => "nvmlDeviceGetMemoryInfo",
            Check::RetiredPages => "nvmlDeviceGetRetiredPagesPendingStatus",
            Check::RemappedRows => "nvmlDeviceGetRemappedRows",
            Check::Ecc => "nvmlDeviceGetTotalEccErrors",
            Check::Events => "nvmlDeviceRegisterEvents",
        }
    }
}

/// A query's failure: NVML's return code and its words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub code: i32,
    /// `Unknown Error (999)`.
    pub text: String,
}

/// NVML's return codes that matter here (`nvmlReturn_t`, declared in
/// cuda-headers/cuslice_nvml.h).
pub mod code {
    pub const NOT_SUPPORTED: i32 = 3;
    pub const NO_PERMISSION: i32 = 4;
    pub const TIMEOUT: i32 = 10;
    pub const FUNCTION_NOT_FOUND: i32 = 13;
    pub const GPU_IS_LOST: i32 = 15;
}

/// What a failure says of the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// `GPU_IS_LOST`.
    Lost,
    /// The check cannot be made here (not supported, no permission, no
    /// such function) or not now (a timeout): no sign of sickness.
    CannotCheck,
    /// Anything else: the GPU does not answer as it should.
    Failed,
}

pub fn failure_kind(code: i32) -> FailureKind {
    match code {
        code::GPU_IS_LOST => FailureKind::Lost,
        code::NOT_SUPPORTED | code::NO_PERMISSION | code::FUNCTION_NOT_FOUND | code::TIMEOUT => {
            FailureKind::CannotCheck
        }
        _ => FailureKind::Failed,
    }
}

/// A check's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Alive,
    RetiredPages {
        pending: bool,
    },
    RemappedRows {
        pending: bool,
        failure: bool,
    },
    /// Uncorrectable ECC errors since the driver loaded (volatile).
    Ecc {
        uncorrected: u64,
    },
    /// Registered for its XID events.
    Events,
}

impl Answer {
    fn check(&self) -> Check {
        match self {
            Answer::Alive => Check::Alive,
            Answer::RetiredPages { .. } => Check::RetiredPages,
            Answer::RemappedRows { .. } => Check::RemappedRows,
            Answer::Ecc { .. } => Check::Ecc,
            Answer::Events => Check::Events,
        }
    }
}

/// One thing NVML said about a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// An XID event.
    Xid(u64),
    /// A double-bit ECC event.
    DoubleBitEcc,
    Answered(Answer),
    Failed(Check, Failure),
}

/// A GPU's health as it is shown and published.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Health {
    pub state: State,
    /// None while healthy.
    #[serde(default)]
    pub cause: Option<Cause>,
    /// One line, None while healthy.
    #[serde(default)]
    pub reason: Option<String>,
    /// When it entered this state (Unix time, seconds).
    pub since_unix: f64,
    /// Unhealthy because the GPU is lost (the DRA taint is NoExecute).
    #[serde(default)]
    pub lost: bool,
}

impl Health {
    pub fn healthy(since: f64) -> Health {
        Health {
            state: State::Healthy,
            cause: None,
            reason: None,
            since_unix: since,
            lost: false,
        }
    }

    /// `unhealthy: XID 79: the GPU has fallen off the bus`; `healthy`.
    pub fn describe(&self) -> String {
        match &self.reason {
            Some(r) => format!("{}: {r}", self.state),
            None => self.state.name().into(),
        }
    }
}

/// A change of a GPU's health: its state, its cause or whether it is lost
/// (a new wording of the same cause is none).
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub from: Health,
    pub to: Health,
}

/// The latest thing of one severity seen: what, and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mark {
    pub cause: Cause,
    pub reason: String,
    pub at_unix: f64,
}

/// One GPU's judge: what was seen, and the health it makes. Serializable:
/// the health source publishes it, and a restarted source takes it up
/// again (a GPU out of service stays out across a restart).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Judge {
    /// The quiet period, seconds.
    pub quiet_seconds: f64,
    /// The checks that answered at least once on this GPU.
    #[serde(default)]
    pub answered: BTreeSet<Check>,
    /// The last uncorrectable ECC count read.
    #[serde(default)]
    pub ecc_uncorrected: Option<u64>,
    /// The latest unhealthy and degraded things seen.
    #[serde(default)]
    pub unhealthy: Option<Mark>,
    #[serde(default)]
    pub degraded: Option<Mark>,
    /// When the GPU was last seen lost.
    #[serde(default)]
    pub lost_at_unix: Option<f64>,
    /// The last operator's clear applied (its time).
    #[serde(default)]
    pub cleared_unix: Option<f64>,
    /// The last XID that did not count, and when (shown, not judged).
    #[serde(default)]
    pub ignored_xid: Option<(u64, f64)>,
    pub health: Health,
}

impl Judge {
    /// A GPU judged healthy from `now`, with a quiet period of `quiet`
    /// seconds (more than 0).
    pub fn new(now: f64, quiet: f64) -> Judge {
        Judge {
            quiet_seconds: quiet,
            answered: BTreeSet::new(),
            ecc_uncorrected: None,
            unhealthy: None,
            degraded: None,
            lost_at_unix: None,
            cleared_unix: None,
            ignored_xid: None,
            health: Health::healthy(now),
        }
    }

    pub fn health(&self) -> &Health {
        &self.health
    }

    fn mark(&mut self, state: State, cause: Cause, reason: String, now: f64) {
        let m = Some(Mark {
            cause,
            reason,
            at_unix: now,
        });
        match state {
            State::Unhealthy => self.unhealthy = m,
            State::Degraded => self.degraded = m,
            State::Healthy => {}
        }
    }

    /// Takes in what NVML said at `now`; the change it makes, if any.
    pub fn observe(&mut self, input: &Input, now: f64) -> Option<Change> {
        match input {
            Input::Xid(n) => {
                let (class, what) = xid_class(*n);
                let reason = format!("XID {n}: {what}");
                match class {
                    XidClass::Lost => {
                        self.lost_at_unix = Some(now);
                        self.mark(State::Unhealthy, Cause::Xid(*n), reason, now);
                    }
                    XidClass::Unhealthy => self.mark(State::Unhealthy, Cause::Xid(*n), reason, now),
                    XidClass::Degraded => self.mark(State::Degraded, Cause::Xid(*n), reason, now),
                    XidClass::Ignored => self.ignored_xid = Some((*n, now)),
                }
            }
            Input::DoubleBitEcc => self.mark(
                State::Unhealthy,
                Cause::DoubleBitEcc,
                "a double-bit ECC error (uncorrectable memory error)".into(),
                now,
            ),
            Input::Answered(a) => {
                self.answered.insert(a.check());
                self.answer(a, now);
            }
            Input::Failed(check, f) => match failure_kind(f.code) {
                FailureKind::Lost => {
                    self.lost_at_unix = Some(now);
                    self.mark(
                        State::Unhealthy,
                        Cause::Lost,
                        format!(
                            "{}: {}: the GPU has fallen off the bus or is otherwise inaccessible",
                            check.call(),
                            f.text
                        ),
                        now,
                    );
                }
                FailureKind::CannotCheck => {}
                FailureKind::Failed if *check == Check::Alive => self.mark(
                    State::Unhealthy,
                    Cause::QueryFailed,
                    format!("{} fails: {}", check.call(), f.text),
                    now,
                ),
                FailureKind::Failed if self.answered.contains(check) => self.mark(
                    State::Unhealthy,
                    Cause::QueryFailed,
                    format!(
                        "{} fails ({}) where it answered before",
                        check.call(),
                        f.text
                    ),
                    now,
                ),
                FailureKind::Failed => self.mark(
                    State::Degraded,
                    Cause::NeverAnswered,
                    format!("{} has never answered ({})", check.call(), f.text),
                    now,
                ),
            },
        }
        self.settle(now)
    }

    fn answer(&mut self, a: &Answer, now: f64) {
        match *a {
            Answer::Alive | Answer::Events => {}
            Answer::RetiredPages { pending } => {
                if pending {
                    self.mark(
                        State::Degraded,
                        Cause::RetiredPagesPending,
                        "retired pages are pending: they take effect when the GPU is reset or the driver reloaded".into(),
                        now,
                    );
                }
            }
            Answer::RemappedRows { pending, failure } => {
                if failure {
                    self.mark(
                        State::Unhealthy,
                        Cause::RowRemapFailure,
                        "a row remapping failed: the GPU needs service".into(),
                        now,
                    );
                }
                if pending {
                    self.mark(
                        State::Degraded,
                        Cause::RowRemapPending,
                        "a row remapping is pending: it takes effect at the next GPU reset".into(),
                        now,
                    );
                }
            }
            Answer::Ecc { uncorrected } => {
                let before = self.ecc_uncorrected.replace(uncorrected);
                if let Some(b) = before.filter(|b| uncorrected > *b) {
                    self.mark(
                        State::Unhealthy,
                        Cause::EccUncorrected,
                        format!(
                            "uncorrectable ECC errors since the driver loaded rose from {b} to {uncorrected}"
                        ),
                        now,
                    );
                }
                if uncorrected > 0 {
                    self.mark(
                        State::Degraded,
                        Cause::EccUncorrected,
                        format!("{uncorrected} uncorrectable ECC errors since the driver loaded"),
                        now,
                    );
                }
            }
        }
    }

    /// The health at `now`: what was seen within the quiet period decides
    /// (the quiet period passing is a change too).
    pub fn settle(&mut self, now: f64) -> Option<Change> {
        let quiet = self.quiet_seconds;
        let active = |m: &Option<Mark>| m.clone().filter(|m| now - m.at_unix < quiet);
        let (state, mark) = match (active(&self.unhealthy), active(&self.degraded)) {
            (Some(m), _) => (State::Unhealthy, Some(m)),
            (None, Some(m)) => (State::Degraded, Some(m)),
            (None, None) => (State::Healthy, None),
        };
        let lost = state == State::Unhealthy && self.lost_at_unix.is_some_and(|t| now - t < quiet);
        let cause = mark.as_ref().map(|m| m.cause);
        let old = &self.health;
        let changed = state != old.state || cause != old.cause || lost != old.lost;
        let next = Health {
            state,
            cause,
            reason: mark.map(|m| m.reason),
            since_unix: if state != old.state {
                now
            } else {
                old.since_unix
            },
            lost,
        };
        let from = std::mem::replace(&mut self.health, next);
        changed.then(|| Change {
            from,
            to: self.health.clone(),
        })
    }

    /// An operator's clear at `at` (Unix time): what was seen up to then is
    /// forgotten, and the GPU is judged afresh at `now` (back in service
    /// unless something was seen since, or is seen again at the next
    /// check). A clear applied already (not newer than the last) does
    /// nothing.
    pub fn clear(&mut self, at: f64, now: f64) -> Option<Change> {
        if self.cleared_unix.is_some_and(|c| at <= c) {
            return None;
        }
        self.cleared_unix = Some(at);
        let before = |m: &Option<Mark>| m.as_ref().is_some_and(|m| m.at_unix <= at);
        if before(&self.unhealthy) {
            self.unhealthy = None;
        }
        if before(&self.degraded) {
            self.degraded = None;
        }
        if self.lost_at_unix.is_some_and(|t| t <= at) {
            self.lost_at_unix = None;
        }
        self.settle(now)
    }
}

/// `unix` (seconds) as UTC, `2026-11-27T10:04:05Z`: how a GPU's `since`
/// is shown.
pub fn utc(unix: f64) -> String {
    let t = unix.max(0.0) as i64;
    let (days, rem) = (t.div_euclid(86_400), t.rem_euclid(86_400));
    // Days since 1970-01-01 to a civil date (the proleptic Gregorian
    // calendar, in eras of 400 years).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// A duration in seconds for people: `45s`, `3m12s`, `2h05m`, `3d04h`.
pub fn ago(seconds: f64) -> String {
    let s = seconds.max(0.0) as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

#[cfg(test)]
mod tests;
