//! Events in both views kube-apiserver serves them: an Event written as `events.k8s.io/v1`
//! (what kube's `Recorder` writes) is read as `core/v1` (what `kubectl describe` and
//! `kubectl events` list), and the other way round, with the fields renamed as the server's
//! conversion renames them (`regarding` <-> `involvedObject`, `note` <-> `message`,
//! `reportingController` <-> `reportingComponent`, `deprecated*` <-> the core fields).
//!
//! Start at `view`: an Event as stored, in the group a client asked for.

use serde_json::{Map, Value as Json};

/// (events.k8s.io/v1 field, core/v1 field) of the renamed fields.
const RENAMES: [(&str, &str); 7] = [
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

/// Whether `(group, plural)` names Events in either view.
pub fn is_event(group: &str, plural: &str) -> bool {
    plural == "events" && (group.is_empty() || group == "events.k8s.io")
}

/// The other view's group of Events.
pub fn other_group(group: &str) -> &'static str {
    if group.is_empty() { "events.k8s.io" } else { "" }
}

/// The groups a list or watch of `group`/`plural` reads: both views for Events, else its own.
pub fn groups(group: &str, plural: &str) -> Vec<String> {
    if is_event(group, plural) {
        vec![group.to_string(), other_group(group).to_string()]
    } else {
        vec![group.to_string()]
    }
}

/// `event`, stored in `from` (the group it was written in), as a client of `to` reads it.
pub fn view(event: &Json, from: &str, to: &str) -> Json {
    if from == to {
        return event.clone();
    }
    let Some(obj) = event.as_object() else { return event.clone() };
    let to_core = to.is_empty();
    let mut out = Map::new();
    for (k, v) in obj {
        let renamed = RENAMES.iter().find_map(|(new, old)| match to_core {
            true if k == new => Some(*old),
            false if k == old => Some(*new),
            _ => None,
        });
        out.insert(renamed.unwrap_or(k).to_string(), v.clone());
    }
    out.insert("apiVersion".into(), Json::from(if to_core { "v1" } else { "events.k8s.io/v1" }));
    out.insert("kind".into(), Json::from("Event"));
    if to_core {
        // A core Event read from the new API names its source for `kubectl describe`'s From.
        if !out.contains_key("source")
            && let Some(c) = out.get("reportingComponent").cloned()
        {
            out.insert("source".into(), serde_json::json!({ "component": c }));
        }
        if let Some(series) = obj.get("series") {
            out.insert("count".into(), series.get("count").cloned().unwrap_or(Json::from(1)));
            if let Some(t) = series.get("lastObservedTime") {
                out.insert("lastTimestamp".into(), t.clone());
            }
        }
    }
    Json::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_event_of_the_new_api_reads_as_a_core_event_and_back() {
        let new = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "cp1.1", "namespace": "ichor-system"},
            "regarding": {"kind": "TalosMachine", "name": "cp1", "namespace": "ichor-system"},
            "note": "config applied", "reason": "Applied", "type": "Normal", "action": "Apply",
            "reportingController": "ichor", "reportingInstance": "ichor-0",
            "eventTime": "2026-11-30T00:00:00.000000Z", "series": {"count": 3, "lastObservedTime": "2026-11-30T00:01:00.000000Z"}});
        let core = view(&new, "events.k8s.io", "");
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(core["involvedObject"]["name"], "cp1");
        assert_eq!(core["message"], "config applied");
        assert_eq!(core["source"]["component"], "ichor");
        assert_eq!(core["count"], 3);
        assert_eq!(core["lastTimestamp"], "2026-11-30T00:01:00.000000Z");
        let back = view(&core, "", "events.k8s.io");
        assert_eq!(back["regarding"], new["regarding"]);
        assert_eq!(back["note"], new["note"]);
        assert_eq!(back["apiVersion"], "events.k8s.io/v1");
    }
}
