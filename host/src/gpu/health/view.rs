//! What a short-lived command (`cuslice status`, `top`, the exporter,
//! `cuslice health`, the OCI hook) takes for each GPU's health: the health
//! source's judgement where one runs (it saw the XID events), and its own
//! look now, whichever is worse. A GPU whose queries fail now is
//! unhealthy whatever the file says; a GPU the source took out stays out
//! whatever one look says. Where no source runs (or it stopped), the look
//! alone: XID events are then not seen, and nothing is remembered between
//! two commands.

use serde::Serialize;

use super::file::{self, Published};
use super::judge::{Health, ago};
use super::probe;
use super::source::DEFAULT_QUIET;
use crate::gpu::nvml::{DeviceHandle, Nvml};
use crate::layout::Layout;

/// One GPU's health as a command shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuView {
    pub index: u32,
    pub uuid: String,
    #[serde(flatten)]
    pub health: Health,
    /// `source`: the health source's judgement; `look`: this command's
    /// own look now (worse than the source's, or no source runs).
    pub judged_by: &'static str,
    /// Whether the source watches its XID events (None: no source).
    pub events: Option<bool>,
    /// The last XID the source saw that does not count, if any.
    pub ignored_xid: Option<u64>,
}

/// The health source whose judgement was read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SourceView {
    pub writer: String,
    pub pid: u32,
    /// Running and wrote lately ([`Published::fresh`]).
    pub up: bool,
    pub updated_seconds_ago: f64,
    pub poll_seconds: f64,
    pub check_seconds: f64,
    pub quiet_seconds: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct View {
    pub gpus: Vec<GpuView>,
    /// The source last published (None: none ever did here).
    pub source: Option<SourceView>,
    /// Why the judgement is this command's look alone (None: the
    /// source's was read).
    pub note: Option<String>,
}

impl View {
    pub fn gpu(&self, uuid: &str) -> Option<&GpuView> {
        self.gpus.iter().find(|g| g.uuid == uuid)
    }
}

const ONE_LOOK: &str = "judged from one look now: XID events are not seen";

/// Every GPU of `devices` at `now`, from the source publishing under
/// `layout` (where it is up) and one look through `nvml`.
pub fn view(layout: &Layout, nvml: &Nvml, devices: &[DeviceHandle], now: f64) -> View {
    let (published, note) = match file::read(layout) {
        Ok(Some(p)) if p.fresh(now) => (Some(p), None),
        Ok(Some(p)) => {
            let note = format!(
                "the health source ({} pid {}) {} {} ago; {ONE_LOOK}",
                p.writer,
                p.pid,
                if p.running { "last wrote" } else { "stopped" },
                ago(now - p.updated_unix)
            );
            return combine(Some(&p), false, Some(note), nvml, devices, now);
        }
        Ok(None) => (
            None,
            Some(format!(
                "no health source runs here (cuslice watch or the DRA plugin publishes GPU health in {}); {ONE_LOOK}",
                layout.health_state().display()
            )),
        ),
        Err(e) => (None, Some(format!("{e}; {ONE_LOOK}"))),
    };
    combine(published.as_ref(), true, note, nvml, devices, now)
}

fn combine(
    p: Option<&Published>,
    trusted: bool,
    note: Option<String>,
    nvml: &Nvml,
    devices: &[DeviceHandle],
    now: f64,
) -> View {
    let quiet = DEFAULT_QUIET.as_secs_f64();
    let gpus = devices
        .iter()
        .map(|d| {
            let look = probe::look(nvml, d, now, quiet).health;
            let from_source = p.filter(|_| trusted).and_then(|p| p.gpu(&d.uuid));
            let source = from_source.map(|g| {
                let mut j = g.judge.clone();
                // A quiet period that passed since it last wrote.
                j.settle(now);
                j.health
            });
            let (health, judged_by) = match source {
                Some(s) if s.state >= look.state => (s, "source"),
                _ => (look, "look"),
            };
            GpuView {
                index: d.index,
                uuid: d.uuid.clone(),
                health,
                judged_by,
                events: from_source.map(|g| g.events),
                ignored_xid: from_source.and_then(|g| g.judge.ignored_xid.map(|(x, _)| x)),
            }
        })
        .collect();
    View {
        gpus,
        source: p.map(|p| SourceView {
            writer: p.writer.clone(),
            pid: p.pid,
            up: p.fresh(now),
            updated_seconds_ago: (now - p.updated_unix).max(0.0),
            poll_seconds: p.poll_seconds,
            check_seconds: p.check_seconds,
            quiet_seconds: p.quiet_seconds,
        }),
        note,
    }
}
