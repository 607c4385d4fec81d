//! What `ichor adopt` keeps of a Cilium someone else installed: the running cilium-config read
//! back into the Cilium chart's values, and merged under the cluster's own layer.
//!
//! Start at `Table::embedded` (rules/cilium/adopt.yaml: cilium-config key, chart value, type),
//! `Table::kept` (what a cilium-config says, as values) and `merge` (the user's layer wins).
//! Pure: cilium-config's data arrives as a map.

use serde_json::Value;
use std::collections::BTreeMap;

/// How a cilium-config text becomes a value of the chart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValueType {
    /// As written.
    String,
    /// `true` or `false`.
    Boolean,
    /// A whole number.
    Integer,
}

/// One row of the table: a cilium-config key and the chart value that writes it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Row {
    /// The cilium-config key (`routing-mode`).
    pub config: String,
    /// The chart value, dotted (`routingMode`, `ipv4.enabled`).
    pub value: String,
    /// How its text reads.
    #[serde(rename = "type")]
    pub type_: ValueType,
}

/// A value kept: where it was read, where it goes, what it is.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Kept {
    /// The cilium-config key it was read from.
    pub config: String,
    /// The chart value it becomes.
    pub value_key: String,
    /// The value.
    pub value: Value,
}

/// A cilium-config entry the table knows but whose text does not read as its type: not kept,
/// and said so.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Unread {
    /// The cilium-config key.
    pub config: String,
    /// Its text.
    pub text: String,
    /// The type the chart value has.
    pub wanted: &'static str,
}

/// Why the table does not load.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {message}")]
pub struct TableError {
    /// The table's file.
    pub file: String,
    /// What is wrong.
    pub message: String,
}

/// The table of rules/cilium/adopt.yaml.
#[derive(Clone, Debug)]
pub struct Table {
    /// Its rows, in the file's order.
    pub rows: Vec<Row>,
}

impl Table {
    /// Reads a table; a duplicate cilium-config key or chart value is an error naming it.
    pub fn parse(file: &str, text: &str) -> Result<Table, TableError> {
        let rows: Vec<Row> = serde_yaml::from_str(text)
            .map_err(|e| TableError { file: file.into(), message: crate::yaml::scrub(&e.to_string()) })?;
        let (mut configs, mut values) = (std::collections::BTreeSet::new(), std::collections::BTreeSet::new());
        for r in &rows {
            for (seen, k) in [(&mut configs, &r.config), (&mut values, &r.value)] {
                if !seen.insert(k.clone()) {
                    return Err(TableError { file: file.into(), message: format!("{k} is listed twice") });
                }
            }
        }
        Ok(Table { rows })
    }

    /// The shipped table.
    pub fn embedded() -> Result<Table, TableError> {
        let (file, text) = crate::embedded::CILIUM_ADOPT;
        Table::parse(file, text)
    }

    /// What `config` (cilium-config's data) says of the table's keys, as chart values, in the
    /// table's order; and the entries whose text does not read as their type.
    pub fn kept(&self, config: &BTreeMap<String, String>) -> (Vec<Kept>, Vec<Unread>) {
        let (mut kept, mut unread) = (vec![], vec![]);
        for r in &self.rows {
            let Some(text) = config.get(&r.config) else { continue };
            let t = text.trim();
            let value = match r.type_ {
                ValueType::String => Some(Value::String(t.to_string())),
                ValueType::Boolean => match t {
                    "true" => Some(Value::Bool(true)),
                    "false" => Some(Value::Bool(false)),
                    _ => None,
                },
                ValueType::Integer => t.parse::<i64>().ok().map(Value::from),
            };
            match value {
                Some(value) => kept.push(Kept { config: r.config.clone(), value_key: r.value.clone(), value }),
                None => unread.push(Unread {
                    config: r.config.clone(),
                    text: text.clone(),
                    wanted: match r.type_ {
                        ValueType::String => "a string",
                        ValueType::Boolean => "true or false",
                        ValueType::Integer => "a whole number",
                    },
                }),
            }
        }
        (kept, unread)
    }
}

/// The user's layer with the kept values under it: a key the layer already sets stays the
/// layer's (the user said it). Returns the merged layer and the kept values it took.
pub fn merge(user: &Value, kept: &[Kept]) -> (Value, Vec<Kept>) {
    let mut out = if user.is_object() { user.clone() } else { Value::Object(Default::default()) };
    let mut taken = vec![];
    for k in kept {
        if lookup(user, &k.value_key).is_some() {
            continue;
        }
        // Keys of the table are plain dotted identifiers (a test pins them): set_key takes them.
        if let Ok(v) = crate::cilium::set_key(&out, &k.value_key, Some(k.value.clone())) {
            out = v;
            taken.push(k.clone());
        }
    }
    (out, taken)
}

/// The value at a dotted key of a layer.
fn lookup<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    key.split('.').try_fold(v, |cur, part| cur.get(part))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn every_value_of_the_table_is_a_key_of_the_embedded_chart_with_its_type() {
        let (_, keys) = crate::embedded::CILIUM_KEYS;
        let inv = crate::inventory::Inventory::parse(keys).unwrap();
        let table = Table::embedded().unwrap();
        assert!(table.rows.len() >= 20, "{}", table.rows.len());
        for r in &table.rows {
            let one = match r.type_ {
                ValueType::String => json!("x"),
                ValueType::Boolean => json!(true),
                ValueType::Integer => json!(1),
            };
            let layer = crate::cilium::set_key(&json!({}), &r.value, Some(one)).unwrap();
            let refusals = crate::cilium::validate(&layer, &inv, true);
            assert!(refusals.is_empty(), "{} ({}): {refusals:?}", r.value, r.config);
        }
    }

    #[test]
    fn cilium_config_reads_back_as_chart_values_typed_and_what_does_not_read_is_named() {
        let table = Table::embedded().unwrap();
        let (kept, unread) = table.kept(&config(&[
            ("routing-mode", "native"),
            ("ipv4-native-routing-cidr", "10.244.0.0/16"),
            ("enable-hubble", "true"),
            ("cluster-id", "7"),
            ("mtu", "nine thousand"),
            ("kube-proxy-replacement", "true"),
            ("ipam", "kubernetes"),
            ("debug", "false"),
        ]));
        let got: Vec<(&str, &Value)> = kept.iter().map(|k| (k.value_key.as_str(), &k.value)).collect();
        assert_eq!(
            got,
            [
                ("routingMode", &json!("native")),
                ("ipv4NativeRoutingCIDR", &json!("10.244.0.0/16")),
                ("cluster.id", &json!(7)),
                ("hubble.enabled", &json!(true)),
            ]
        );
        assert_eq!(unread, [Unread { config: "mtu".into(), text: "nine thousand".into(), wanted: "a whole number" }]);
    }

    #[test]
    fn the_users_layer_wins_over_what_runs() {
        let table = Table::embedded().unwrap();
        let (kept, _) = table.kept(&config(&[("routing-mode", "native"), ("enable-hubble", "false")]));
        let user = json!({"hubble": {"enabled": true, "relay": {"enabled": true}}});
        let (merged, taken) = merge(&user, &kept);
        assert_eq!(merged, json!({"hubble": {"enabled": true, "relay": {"enabled": true}}, "routingMode": "native"}));
        assert_eq!(taken.iter().map(|k| k.config.as_str()).collect::<Vec<_>>(), ["routing-mode"]);
        // No layer at all: the kept values are the layer.
        let (merged, _) = merge(&Value::Null, &kept);
        assert_eq!(merged, json!({"routingMode": "native", "hubble": {"enabled": false}}));
    }

    #[test]
    fn a_table_that_lists_a_key_twice_is_refused_naming_it() {
        let e =
            Table::parse("t.yaml", "- {config: a, value: x, type: string}\n- {config: a, value: y, type: string}\n")
                .unwrap_err();
        assert_eq!(e.to_string(), "t.yaml: a is listed twice");
    }
}
