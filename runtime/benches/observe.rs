//! Observing a simulated fleet of 1,000 nodes over mTLS on loopback: the fleet's time against
//! one node's observation times 1,000 / concurrency (the ideal of a perfectly parallel fan-out),
//! measured in the same process. Target: the fleet in under 2 s on the CI machine (2 cores).
//! `cargo bench -p runtime --bench observe`; under `cargo test` it observes 50 nodes once.

use runtime::sim::talos::{Fleet, fleet_spec};
use runtime::talos::client::Client;
use runtime::talos::config::TalosConfig;
use runtime::talos::observe::{Observed, observe_fleet, observe_node};
use std::time::{Duration, Instant};

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let smoke = !std::env::args().any(|a| a == "--bench");
        let nodes = if smoke { 50 } else { 1000 };
        let concurrency = 64;
        let fleet = Fleet::start(fleet_spec(nodes, 3, &["v1.14.3".into()]), "127.0.0.1:0".parse().unwrap()).await.unwrap();
        let text = fleet.talosconfig(&["os:admin"]).unwrap();
        let cfg = TalosConfig::parse(&text, "talosconfig").unwrap();
        let (name, ctx) = cfg.context(None, "talosconfig").unwrap();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
        let creds = ctx.credentials(name, "talosconfig", now).unwrap();
        let client = Client::new(ctx, &creds, Duration::from_secs(10)).unwrap();
        let names = fleet.nodes();
        // Warm the connection, then one node's observation, the median of 21.
        observe_node(&client, &names[0]).await.unwrap();
        let mut one = vec![];
        for i in 0..21 {
            let t = Instant::now();
            observe_node(&client, &names[i % names.len()]).await.unwrap();
            one.push(t.elapsed());
        }
        one.sort();
        let one = one[one.len() / 2];
        let t = Instant::now();
        let seen = observe_fleet(&client, &names, concurrency).await;
        let fleet_time = t.elapsed();
        let known = seen.iter().filter(|o| matches!(o, Observed::Known(_))).count();
        assert_eq!(known, nodes, "every node observed");
        let ideal = one * nodes as u32 / concurrency as u32;
        println!(
            "observe a simulated fleet of {nodes} nodes (concurrency {concurrency}): {:.0} ms (target < 2000 ms for 1000); one node {:.2} ms; ratio to one x {nodes} / {concurrency} = {:.2}",
            fleet_time.as_secs_f64() * 1000.0,
            one.as_secs_f64() * 1000.0,
            fleet_time.as_secs_f64() / ideal.as_secs_f64()
        );
    });
}
