//! Ichor's namespace locked down with CiliumNetworkPolicies (issue 28, item 5; the CNI page:
//! "Ichor's own namespace is locked down with CiliumNetworkPolicies once Cilium is ready").
//!
//! Pure: `policies` turns a `Lockdown` (the namespace, where metrics may be scraped from, the
//! Talos nodes' addresses) into the policies' objects. When they apply is the rules'
//! (`np_lockdown` in rules/lockdown.rules: Cilium rolled out and its policy kind served); the
//! cluster host (`handover::io::reconcile`) writes them, only when one differs, under
//! `FIELD_MANAGER`. Start at `policies`.
//!
//! Invariant: what a policy allows is exactly what Ichor's pods need: the webhook is reached
//! only by the API server (and the kubelet's probes, from the node), the controller's metrics
//! only from the CIDRs the user names, and every pod reaches out only to the API server, the
//! cluster DNS and the Talos API (port 50000) of the nodes.

use serde_json::{Value as Json, json};

/// The field manager the policies are written under (kept apart from every other writer).
pub const FIELD_MANAGER: &str = "ichor-network-policy";
/// Talos's API port (apid), what the controller reaches every node on.
pub const TALOS_API_PORT: u16 = 50000;
/// The webhook's and the controller's container ports (runtime::install's Deployments).
pub const WEBHOOK_PORT: u16 = 9443;
pub const METRICS_PORT: u16 = 8080;
/// The policies' names, in the order `policies` returns them.
pub const NAMES: [&str; 3] = ["ichor-webhook-ingress", "ichor-controller-ingress", "ichor-egress"];

/// What the lockdown is made from.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Lockdown {
    /// Ichor's namespace.
    pub namespace: String,
    /// CIDRs the controller's metrics may be scraped from (`--metrics-from`); none: only the
    /// kubelet's probes reach the controller.
    pub metrics_from: Vec<String>,
    /// The Talos nodes' addresses that are IPs (TalosMachines' `spec.address`), as /32 or /128:
    /// nodes outside this cluster are reached there (this cluster's own nodes are the `host` and
    /// `remote-node` entities).
    pub talos_nodes: Vec<String>,
}

/// A bad `--metrics-from`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("--metrics-from {value:?}: not a CIDR (for example 10.0.0.0/8 or fd00::/8)")]
pub struct CidrError {
    pub value: String,
}

/// Checks a CIDR (`10.0.0.0/8`, `fd00::/8`; an address alone is its /32 or /128).
pub fn cidr(value: &str) -> Result<String, CidrError> {
    let bad = || CidrError { value: value.to_string() };
    let (addr, prefix) = value.split_once('/').map_or((value, None), |(a, p)| (a, Some(p)));
    let ip: std::net::IpAddr = addr.parse().map_err(|_| bad())?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let prefix: u8 = match prefix {
        None => max,
        Some(p) => p.parse().ok().filter(|p| *p <= max).ok_or_else(bad)?,
    };
    Ok(format!("{ip}/{prefix}"))
}

/// The Talos nodes' CIDRs from machine addresses: the IPs as /32 or /128, sorted, once each (a
/// host name is left to the `host` and `remote-node` entities).
pub fn talos_nodes<'a>(addresses: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = addresses
        .into_iter()
        .filter_map(|a| {
            // `[v6]:port`, `v4:port`, or an address alone.
            let host = match a.strip_prefix('[') {
                Some(rest) => rest.split(']').next().unwrap_or(rest),
                None => match a.rsplit_once(':') {
                    Some((h, p)) if !h.contains(':') && p.parse::<u16>().is_ok() => h,
                    _ => a,
                },
            };
            host.parse::<std::net::IpAddr>().ok()
        })
        .map(|ip| format!("{ip}/{}", if ip.is_ipv4() { 32 } else { 128 }))
        .collect();
    out.sort();
    out.dedup();
    out
}

fn ports(list: &[(u16, &str)]) -> Json {
    json!([{"ports": list.iter().map(|(p, proto)| json!({"port": p.to_string(), "protocol": proto})).collect::<Vec<_>>()}])
}

fn policy(l: &Lockdown, name: &str, description: &str, spec: Json) -> Json {
    let mut spec = spec;
    spec["description"] = json!(description);
    json!({
        "apiVersion": "cilium.io/v2",
        "kind": "CiliumNetworkPolicy",
        "metadata": {"name": name, "namespace": l.namespace, "labels": {"app.kubernetes.io/managed-by": "ichor"}},
        "spec": spec,
    })
}

/// The three policies, in `NAMES` order.
pub fn policies(l: &Lockdown) -> Vec<Json> {
    let selector = |app: &str| json!({"matchLabels": {"app.kubernetes.io/name": app}});
    let mut controller_ingress = vec![json!({"fromEntities": ["host"], "toPorts": ports(&[(METRICS_PORT, "TCP")])})];
    if !l.metrics_from.is_empty() {
        controller_ingress.push(json!({"fromCIDR": l.metrics_from, "toPorts": ports(&[(METRICS_PORT, "TCP")])}));
    }
    let mut egress = vec![
        json!({"toEntities": ["kube-apiserver"]}),
        json!({
            "toEndpoints": [{"matchLabels": {"k8s:io.kubernetes.pod.namespace": "kube-system", "k8s:k8s-app": "kube-dns"}}],
            "toPorts": ports(&[(53, "UDP"), (53, "TCP")]),
        }),
        json!({"toEntities": ["host", "remote-node"], "toPorts": ports(&[(TALOS_API_PORT, "TCP")])}),
    ];
    if !l.talos_nodes.is_empty() {
        egress.push(json!({"toCIDR": l.talos_nodes, "toPorts": ports(&[(TALOS_API_PORT, "TCP")])}));
    }
    vec![
        policy(
            l,
            NAMES[0],
            "Ichor's webhook is reached only by the API server (and the kubelet's probes from the node)",
            json!({
                "endpointSelector": selector("ichor-webhook"),
                "ingress": [{"fromEntities": ["kube-apiserver", "host"], "toPorts": ports(&[(WEBHOOK_PORT, "TCP")])}],
            }),
        ),
        policy(
            l,
            NAMES[1],
            "Ichor's controller: metrics only from the CIDRs named by --metrics-from (and the kubelet's probes)",
            json!({"endpointSelector": selector("ichor-controller"), "ingress": controller_ingress}),
        ),
        policy(
            l,
            NAMES[2],
            "Ichor's pods reach only the API server, the cluster DNS and the Talos API of the nodes",
            json!({"endpointSelector": {}, "egress": egress}),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_are_checked_and_an_address_alone_is_its_host_route() {
        assert_eq!(cidr("10.0.0.0/8").unwrap(), "10.0.0.0/8");
        assert_eq!(cidr("192.168.1.10").unwrap(), "192.168.1.10/32");
        assert_eq!(cidr("fd00::/8").unwrap(), "fd00::/8");
        for bad in ["10.0.0.0/33", "prometheus", "10.0.0/8", "fd00::/129", ""] {
            assert_eq!(cidr(bad), Err(CidrError { value: bad.into() }), "{bad}");
        }
    }

    #[test]
    fn talos_nodes_are_the_ip_addresses_once_each() {
        let got = talos_nodes(["10.5.0.2", "10.5.0.3:50000", "node1.lab", "10.5.0.2", "[fd00::1]:50000", "fd00::2"]);
        assert_eq!(got, ["10.5.0.2/32", "10.5.0.3/32", "fd00::1/128", "fd00::2/128"]);
    }

    #[test]
    fn the_webhook_takes_only_the_api_server_and_the_pods_reach_only_what_they_need() {
        let l = Lockdown {
            namespace: "ichor-system".into(),
            metrics_from: vec!["10.0.0.0/8".into()],
            talos_nodes: vec!["10.5.0.2/32".into()],
        };
        let p = policies(&l);
        let names: Vec<&str> = p.iter().map(|x| x["metadata"]["name"].as_str().unwrap()).collect();
        assert_eq!(names, NAMES);
        assert!(p.iter().all(|x| x["metadata"]["namespace"] == "ichor-system" && x["kind"] == "CiliumNetworkPolicy"));
        assert_eq!(p[0]["spec"]["ingress"][0]["fromEntities"], json!(["kube-apiserver", "host"]));
        assert_eq!(p[0]["spec"]["ingress"][0]["toPorts"][0]["ports"][0]["port"], "9443");
        assert_eq!(p[1]["spec"]["ingress"][1]["fromCIDR"], json!(["10.0.0.0/8"]));
        let egress = p[2]["spec"]["egress"].as_array().unwrap();
        assert_eq!(egress[0]["toEntities"], json!(["kube-apiserver"]));
        assert_eq!(egress[3]["toCIDR"], json!(["10.5.0.2/32"]));
        assert!(
            egress.iter().skip(1).all(|e| e.get("toPorts").is_some()),
            "every egress but the API server's has ports"
        );
        // Without --metrics-from, the controller takes only the kubelet's probes.
        let none = policies(&Lockdown { metrics_from: vec![], ..l });
        assert_eq!(none[1]["spec"]["ingress"].as_array().unwrap().len(), 1);
    }
}
