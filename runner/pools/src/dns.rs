//! Keeps an address spec's pools in step with DNS: every address the host
//! resolves to is one pool, looked up again every [`RESOLVE_EVERY`] so that
//! pools behind a name (a Kubernetes headless Service, say) come and go
//! with it. An IP address is its own single pool, looked up once.

use std::sync::Weak;
use std::time::Duration;

use tokio::sync::watch;

use super::directory::{Discovered, PoolDirectory};
use super::spec::{host_port, PoolSpec};

/// How often a DNS name is looked up again.
pub const RESOLVE_EVERY: Duration = Duration::from_secs(10);

/// Follows `host:port` for `spec` until the spec is removed (`stop`) or
/// the directory is gone.
pub(super) async fn follow(
    directory: Weak<PoolDirectory>,
    spec: PoolSpec,
    host: String,
    port: u16,
    mut stop: watch::Receiver<bool>,
) {
    let literal = host.parse::<std::net::IpAddr>().is_ok();
    loop {
        let Some(dir) = directory.upgrade() else {
            return;
        };
        match tokio::net::lookup_host((host.as_str(), port)).await {
            Ok(addresses) => {
                let mut found: Vec<Discovered> = addresses
                    .map(|a| Discovered {
                        address: if literal {
                            host_port(&host, port)
                        } else {
                            a.to_string()
                        },
                        capacity: dir.address_capacity(),
                        node: None,
                    })
                    .collect();
                found.dedup_by(|a, b| a.address == b.address);
                dir.set_pools(&spec, found);
            }
            // Keep the pools found before: a name server's hiccup is not
            // the pools' death.
            Err(error) => {
                tracing::warn!(spec = %spec, %error, "cannot resolve a worker pool's host");
                dir.set_trouble(&spec, format!("cannot resolve {host}: {error}"));
            }
        }
        drop(dir);
        if literal {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(RESOLVE_EVERY) => {}
            _ = stop.changed() => return,
        }
    }
}
