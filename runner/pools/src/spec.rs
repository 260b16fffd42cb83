//! What an operator writes to name a pool: `[SDK=]HOST:PORT` or
//! `ray://HEAD:PORT`, parsed once into a [`PoolSpec`].

use std::fmt;
use std::str::FromStr;

use refract_sdk_harness::BeamSdk;

/// A source of worker pools, as `--worker_pool` and `refract pools add`
/// name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolSpec {
    /// The SDK the pools run; `None`: any environment may use them.
    pub sdk: Option<BeamSdk>,
    /// Where the pools are found.
    pub target: PoolTarget,
}

/// Where a spec's pools are found.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PoolTarget {
    /// A host and port; a DNS name stands for every address it resolves
    /// to, one pool each, re-resolved as long as the spec is known.
    Address {
        /// An IP address or a DNS name.
        host: String,
        /// The pools' port.
        port: u16,
    },
    /// A Ray cluster: one Python pool per node, started as Ray actors.
    Ray {
        /// What `ray.init` is given (`ray://HEAD:PORT`, `HEAD:PORT`).
        address: String,
    },
}

/// Why a spec could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PoolSpecError {
    /// The `SDK=` prefix names no SDK.
    #[error("unknown SDK {0:?} in a worker pool (expected python, java or go)")]
    UnknownSdk(String),
    /// No `:PORT`, or a port that is not a number from 1 to 65535.
    #[error("worker pool {0:?} is not HOST:PORT with a port from 1 to 65535")]
    BadAddress(String),
    /// A Ray cluster runs Python pools only.
    #[error("a Ray cluster's pools run the Python SDK; {0:?} asks for another")]
    RayNotPython(String),
}

const RAY_SCHEME: &str = "ray://";

impl FromStr for PoolSpec {
    type Err = PoolSpecError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        // An `=` before any `://` separates the SDK from the address.
        let scheme_at = text.find("://").unwrap_or(text.len());
        let (sdk, rest) = match text.find('=') {
            Some(eq) if eq < scheme_at => {
                let (name, rest) = text.split_at(eq);
                let sdk = BeamSdk::parse(name)
                    .ok_or_else(|| PoolSpecError::UnknownSdk(name.to_string()))?;
                (Some(sdk), rest.get(1..).unwrap_or_default())
            }
            _ => (None, text),
        };
        if rest.starts_with(RAY_SCHEME) {
            if sdk.is_some_and(|s| s != BeamSdk::Python) {
                return Err(PoolSpecError::RayNotPython(text.to_string()));
            }
            let head = rest.get(RAY_SCHEME.len()..).unwrap_or_default();
            if head.is_empty() {
                return Err(PoolSpecError::BadAddress(text.to_string()));
            }
            return Ok(PoolSpec {
                sdk: Some(BeamSdk::Python),
                target: PoolTarget::Ray {
                    address: rest.to_string(),
                },
            });
        }
        let bad = || PoolSpecError::BadAddress(text.to_string());
        let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let host_ok = !host.is_empty()
            && !host.contains('/')
            && (host.parse::<std::net::IpAddr>().is_ok() || !host.contains(':'));
        if port == 0 || !host_ok {
            return Err(bad());
        }
        Ok(PoolSpec {
            sdk,
            target: PoolTarget::Address {
                host: host.to_string(),
                port,
            },
        })
    }
}

impl fmt::Display for PoolSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.target {
            PoolTarget::Ray { address } => write!(f, "{address}"),
            PoolTarget::Address { host, port } => {
                if let Some(sdk) = self.sdk {
                    write!(f, "{}=", sdk.name())?;
                }
                write!(f, "{}", host_port(host, *port))
            }
        }
    }
}

/// `host:port`, with an IPv6 address in brackets.
pub(crate) fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str) -> Result<PoolSpec, PoolSpecError> {
        text.parse()
    }

    #[test]
    fn addresses_with_and_without_an_sdk() {
        let s = spec("10.0.0.2:50000").unwrap();
        assert_eq!(s.sdk, None);
        assert_eq!(
            s.target,
            PoolTarget::Address {
                host: "10.0.0.2".into(),
                port: 50000
            }
        );
        assert_eq!(s.to_string(), "10.0.0.2:50000");
        let s = spec("java=pools.example.internal:7000").unwrap();
        assert_eq!(s.sdk, Some(BeamSdk::Java));
        assert_eq!(s.to_string(), "java=pools.example.internal:7000");
        let s = spec("python=[fd00::5]:80").unwrap();
        assert_eq!(
            s.target,
            PoolTarget::Address {
                host: "fd00::5".into(),
                port: 80
            }
        );
        assert_eq!(s.to_string(), "python=[fd00::5]:80");
    }

    #[test]
    fn ray_clusters_run_python_pools() {
        let s = spec("ray://head:10001").unwrap();
        assert_eq!(s.sdk, Some(BeamSdk::Python));
        assert_eq!(
            s.target,
            PoolTarget::Ray {
                address: "ray://head:10001".into()
            }
        );
        assert_eq!(s.to_string(), "ray://head:10001");
        assert!(spec("python=ray://head:10001").is_ok());
        assert_eq!(
            spec("java=ray://head:1"),
            Err(PoolSpecError::RayNotPython("java=ray://head:1".into()))
        );
    }

    #[test]
    fn malformed_specs_say_what_is_wrong() {
        assert_eq!(
            spec("rust=h:1"),
            Err(PoolSpecError::UnknownSdk("rust".into()))
        );
        for bad in [
            "host",
            "host:",
            "host:0",
            "host:70000",
            ":5",
            "a:b:5",
            "ray://",
            "http://h:5",
        ] {
            assert!(
                matches!(spec(bad), Err(PoolSpecError::BadAddress(_))),
                "{bad}"
            );
        }
    }
}
