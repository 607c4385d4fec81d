//! Maintenance windows (`spec.maintenanceWindows`, issue 53): whether one is open at a time, and
//! when the next opens. Pure: the clock is the caller's. The schedules are croner's (five-field
//! cron, POSIX/Vixie semantics, daylight-saving changes handled), the time zones chrono-tz's.
//!
//! Start at `at`: what the operations' rules get as facts (`has_windows`, `window_open`,
//! `window_next`, `window_problem`). `problems` is what admission refuses.

use chrono::{TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use render::api::MaintenanceWindow;
use std::str::FromStr;

/// The longest clock one machine's step runs on (a reboot's: rules/rollout.rules
/// `rollout_limit`, 20 minutes; a test pins the two): a shorter window could close on every step.
pub const STEP_CLOCK_MINUTES: u32 = 20;

/// The windows at one time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowsAt {
    /// One of them is open.
    pub open: bool,
    /// When the next one opens (seconds since 1970), when none is open.
    pub next_start: Option<i64>,
}

/// A spec field refused (a maintenance window, a health check): its field path and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct FieldProblem {
    pub path: String,
    pub message: String,
}

/// A window's schedule and zone, read.
struct Read {
    cron: Cron,
    tz: Tz,
    minutes: i64,
}

fn read(i: usize, w: &MaintenanceWindow) -> Result<Read, Vec<FieldProblem>> {
    let at =
        |field: &str, message: String| FieldProblem { path: format!("spec.maintenanceWindows[{i}].{field}"), message };
    let mut problems = vec![];
    let cron = Cron::from_str(&w.schedule)
        .map_err(|e| {
            problems.push(at(
                "schedule",
                format!("{:?} is not a cron schedule ({e}): five fields, minute hour day-of-month month day-of-week, for example \"0 2 * * SAT\"", w.schedule),
            ))
        })
        .ok();
    let tz = Tz::from_str(&w.time_zone)
        .map_err(|_| {
            problems.push(at(
                "timeZone",
                format!("{:?} is not an IANA time zone: use a name such as \"UTC\" or \"Europe/Berlin\"", w.time_zone),
            ))
        })
        .ok();
    match (cron, tz) {
        (Some(cron), Some(tz)) if problems.is_empty() => Ok(Read { cron, tz, minutes: i64::from(w.duration_minutes) }),
        _ => Err(problems),
    }
}

/// Every problem of `windows` at once, as admission refuses them: a schedule or a time zone that
/// does not parse, a window shorter than one step's clock, a schedule that never fires.
pub fn problems(windows: &[MaintenanceWindow], now: i64) -> Vec<FieldProblem> {
    let mut out = vec![];
    for (i, w) in windows.iter().enumerate() {
        if w.duration_minutes < STEP_CLOCK_MINUTES {
            out.push(FieldProblem {
                path: format!("spec.maintenanceWindows[{i}].durationMinutes"),
                message: format!(
                    "{} minutes is shorter than one machine's step may take ({STEP_CLOCK_MINUTES} minutes, a reboot's clock): make the window at least that long",
                    w.duration_minutes
                ),
            });
        }
        match read(i, w) {
            Err(p) => out.extend(p),
            Ok(r) => {
                if next(&r, now).is_none() {
                    out.push(FieldProblem {
                        path: format!("spec.maintenanceWindows[{i}].schedule"),
                        message: format!("{:?} never fires: no operation could ever start", w.schedule),
                    });
                }
            }
        }
    }
    out
}

fn local(r: &Read, t: i64) -> Option<chrono::DateTime<Tz>> {
    Utc.timestamp_opt(t, 0).single().map(|u| u.with_timezone(&r.tz))
}

/// The window's next start after `t` (exclusive).
fn next(r: &Read, t: i64) -> Option<i64> {
    r.cron.find_next_occurrence(&local(r, t)?, false).ok().map(|d| d.timestamp())
}

/// Whether the window is open at `t`: it opened at its latest start at or before `t`, and its
/// duration has not run out.
fn open(r: &Read, t: i64) -> bool {
    let Some(now) = local(r, t) else { return false };
    match r.cron.find_previous_occurrence(&now, true) {
        Ok(start) => start.timestamp() <= t && t < start.timestamp() + r.minutes * 60,
        Err(_) => false,
    }
}

/// The windows at `t` (seconds since 1970): open if one is, else when the next opens. Windows
/// that do not read are every problem at once.
pub fn at(windows: &[MaintenanceWindow], t: i64) -> Result<WindowsAt, Vec<FieldProblem>> {
    let mut read_all = vec![];
    let mut problems = vec![];
    for (i, w) in windows.iter().enumerate() {
        match read(i, w) {
            Ok(r) => read_all.push(r),
            Err(p) => problems.extend(p),
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let open_now = read_all.iter().any(|r| open(r, t));
    let next_start = if open_now { None } else { read_all.iter().filter_map(|r| next(r, t)).min() };
    Ok(WindowsAt { open: open_now, next_start })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(schedule: &str, minutes: u32, tz: &str) -> MaintenanceWindow {
        MaintenanceWindow { schedule: schedule.into(), duration_minutes: minutes, time_zone: tz.into() }
    }

    /// 2026-12-07T10:30:00Z, a Monday.
    const MON_1030: i64 = 1_796_639_400;

    #[test]
    fn a_window_is_open_from_its_start_for_its_duration_and_the_next_start_is_said_otherwise() {
        assert_eq!(crate::plan::rfc3339(MON_1030), "2026-12-07T10:30:00Z");
        // Daily at 10:00 for an hour: open at 10:30.
        assert_eq!(at(&[w("0 10 * * *", 60, "UTC")], MON_1030), Ok(WindowsAt { open: true, next_start: None }));
        // For 20 minutes: closed since 10:20; the next opens tomorrow at 10:00.
        let tomorrow = MON_1030 + 86_400 - 30 * 60;
        assert_eq!(
            at(&[w("0 10 * * *", 20, "UTC")], MON_1030),
            Ok(WindowsAt { open: false, next_start: Some(tomorrow) })
        );
        // The earliest of two windows is the next.
        let both = [w("0 10 * * *", 20, "UTC"), w("0 12 * * *", 60, "UTC")];
        assert_eq!(at(&both, MON_1030).unwrap().next_start, Some(MON_1030 + 90 * 60));
        // No window: open at any time is the caller's (it passes none), here nothing is open.
        assert_eq!(at(&[], MON_1030), Ok(WindowsAt { open: false, next_start: None }));
    }

    #[test]
    fn a_schedule_is_read_in_its_time_zone() {
        // 11:00 in Berlin (UTC+1 in December) is 10:00 UTC: open at 10:30 UTC.
        assert!(at(&[w("0 11 * * *", 60, "Europe/Berlin")], MON_1030).unwrap().open);
        // 10:00 in New York is 15:00 UTC: closed, opens at 15:00 UTC.
        let ny = at(&[w("0 10 * * *", 60, "America/New_York")], MON_1030).unwrap();
        assert_eq!(ny, WindowsAt { open: false, next_start: Some(MON_1030 + 270 * 60) });
        // Saturdays only: the next is 2026-12-12T02:00:00Z.
        let sat = at(&[w("0 2 * * SAT", 240, "UTC")], MON_1030).unwrap();
        assert_eq!(sat.next_start.map(crate::plan::rfc3339).as_deref(), Some("2026-12-12T02:00:00Z"));
    }

    #[test]
    fn the_step_clock_is_the_rules_reboot_clock() {
        let engine = crate::plan::Planner::embedded().unwrap().engine;
        let db = engine.evaluate(&engine.empty_facts(), engine::EvalOptions::default()).unwrap();
        let limit = db.decoded(engine.program.relation("rollout_limit").unwrap());
        assert_eq!(limit, vec![vec![engine::Const::Num(i64::from(STEP_CLOCK_MINUTES) * 60)]]);
    }

    #[test]
    fn every_problem_is_named_with_its_field_path_at_once() {
        let bad = [w("0 25 * * *", 5, "Mars/Olympus"), w("0 0 30 2 *", 60, "UTC")];
        let p: Vec<String> = problems(&bad, MON_1030).iter().map(ToString::to_string).collect();
        assert!(p[0].starts_with("spec.maintenanceWindows[0].durationMinutes: 5 minutes is shorter"), "{p:?}");
        assert!(
            p[1].starts_with("spec.maintenanceWindows[0].schedule: \"0 25 * * *\" is not a cron schedule"),
            "{p:?}"
        );
        assert!(
            p[2].starts_with("spec.maintenanceWindows[0].timeZone: \"Mars/Olympus\" is not an IANA time zone"),
            "{p:?}"
        );
        assert!(p[3].starts_with("spec.maintenanceWindows[1].schedule: \"0 0 30 2 *\" never fires"), "{p:?}");
        assert_eq!(p.len(), 4, "{p:?}");
        assert!(at(&bad, MON_1030).is_err());
        assert!(problems(&[w("0 2 * * SAT", 240, "Europe/Berlin")], MON_1030).is_empty());
    }
}
