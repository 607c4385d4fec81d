//! Crash points: the process ends at once, as a SIGKILL would (no destructor runs, the Lease is
//! not released, nothing is flushed), right after a write of a kind the environment names. The
//! crash tests use them to stop the controller exactly after each kind of write (a Talos apply,
//! a reboot, a server-side apply, a delete, a Job create, a status write) and start it again.
//!
//! `ICHOR_CRASH_AFTER=KIND[,KIND...][:N]`: after the Nth write (default 1) of this process whose
//! kind is listed. Start at `arm` (called once at the controller's start; a bad value is an
//! error there, not a silent no-op) and `after` (called by the executor and the status writers
//! once a write succeeded). Unarmed, `after` does nothing.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// The kinds of write the controller makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write {
    /// ApplyConfiguration (NO_REBOOT or STAGED).
    TalosApply,
    /// MachineService.Reboot.
    TalosReboot,
    /// A Talos upgrade call (LifecycleService.Upgrade, or MachineService.Upgrade).
    TalosUpgrade,
    /// A server-side apply of manifests (a sync, a restored kube-proxy).
    ServerSideApply,
    /// A delete of a Kubernetes object.
    Delete,
    /// A Cilium Job created.
    JobCreate,
    /// A release's stage started (its spec field set, its TalosOperation created).
    StageCreate,
    /// A Node cordoned or uncordoned.
    Cordon,
    /// A Node drained (its evictions).
    Drain,
    /// A status written (a TalosOperation's, a TalosMachine's or a TalosCluster's).
    Status,
}

impl Write {
    pub const ALL: [Write; 10] = [
        Write::TalosApply,
        Write::TalosReboot,
        Write::TalosUpgrade,
        Write::ServerSideApply,
        Write::Delete,
        Write::JobCreate,
        Write::StageCreate,
        Write::Cordon,
        Write::Drain,
        Write::Status,
    ];

    /// Its name in `ICHOR_CRASH_AFTER`.
    pub fn name(self) -> &'static str {
        match self {
            Write::TalosApply => "talos-apply",
            Write::TalosReboot => "talos-reboot",
            Write::TalosUpgrade => "talos-upgrade",
            Write::ServerSideApply => "server-side-apply",
            Write::Delete => "delete",
            Write::JobCreate => "job-create",
            Write::StageCreate => "stage-create",
            Write::Cordon => "cordon",
            Write::Drain => "drain",
            Write::Status => "status",
        }
    }
}

/// Where and when the process ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrashPoint {
    pub kinds: Vec<Write>,
    /// After this many matching writes (at least 1).
    pub after: u32,
}

/// `ICHOR_CRASH_AFTER` does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("ICHOR_CRASH_AFTER={value:?}: {problem}; expected KIND[,KIND...][:N] with KIND one of {}", kinds())]
pub struct CrashPointError {
    pub value: String,
    pub problem: String,
}

fn kinds() -> String {
    Write::ALL.iter().map(|w| w.name()).collect::<Vec<_>>().join(", ")
}

impl CrashPoint {
    /// Parses `KIND[,KIND...][:N]`.
    pub fn parse(value: &str) -> Result<CrashPoint, CrashPointError> {
        let fail = |problem: String| CrashPointError { value: value.to_string(), problem };
        let (list, n) = match value.rsplit_once(':') {
            Some((list, n)) => {
                let n: u32 = n.parse().map_err(|_| fail(format!("{n:?} is not a count")))?;
                (list, n)
            }
            None => (value, 1),
        };
        if n == 0 {
            return Err(fail("the count starts at 1".into()));
        }
        let mut kinds = vec![];
        for name in list.split(',').map(str::trim) {
            match Write::ALL.iter().find(|w| w.name() == name) {
                Some(w) => kinds.push(*w),
                None => return Err(fail(format!("no kind of write {name:?}"))),
            }
        }
        Ok(CrashPoint { kinds, after: n })
    }
}

static ARMED: OnceLock<Option<CrashPoint>> = OnceLock::new();
static SEEN: AtomicU32 = AtomicU32::new(0);

/// Reads `ICHOR_CRASH_AFTER` (once per process): the crash point it arms, if any.
pub fn arm() -> Result<Option<CrashPoint>, CrashPointError> {
    let parsed = match std::env::var("ICHOR_CRASH_AFTER") {
        Ok(v) if !v.trim().is_empty() => Some(CrashPoint::parse(v.trim())?),
        _ => None,
    };
    Ok(ARMED.get_or_init(|| parsed).clone())
}

/// A write of this kind succeeded: ends the process if it is the armed one.
pub fn after(w: Write) {
    let Some(Some(point)) = ARMED.get() else { return };
    if !point.kinds.contains(&w) {
        return;
    }
    let n = SEEN.fetch_add(1, Ordering::SeqCst) + 1;
    if n >= point.after {
        eprintln!("ichor: crash point: ending the process right after {} (write {n})", w.name());
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crash_point_names_its_kinds_and_count() {
        let p = CrashPoint::parse("talos-apply,status:3").unwrap();
        assert_eq!(p, CrashPoint { kinds: vec![Write::TalosApply, Write::Status], after: 3 });
        assert_eq!(CrashPoint::parse("delete").unwrap().after, 1);
        let e = CrashPoint::parse("talos-aply").unwrap_err();
        assert!(e.to_string().contains("no kind of write \"talos-aply\""), "{e}");
        assert!(e.to_string().contains("talos-apply, talos-reboot"), "{e}");
        assert!(CrashPoint::parse("delete:0").is_err());
        assert!(CrashPoint::parse("delete:x").unwrap_err().to_string().contains("\"x\" is not a count"));
    }
}
