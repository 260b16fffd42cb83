//! Which environments go to pools, and the environment a pooled worker
//! is started with.

use prost::Message;
use refract_proto::pipeline::{ApiServiceDescriptor, Environment, ExternalPayload};
use refract_proto::urns;
use refract_sdk_harness::BeamSdk;

use super::directory::{PoolDirectory, PoolNeed};

/// What `environment` asks of a pool, if some pool of `directory` serves
/// it (see the module docs of [`super`]); `None`: it starts as it says.
pub fn pool_need(environment: &Environment, directory: &PoolDirectory) -> Option<PoolNeed> {
    let need = match environment.urn.as_str() {
        urns::env::DOCKER => PoolNeed {
            sdk: BeamSdk::of_environment(environment),
        },
        urns::env::PROCESS => PoolNeed { sdk: None },
        urns::env::EXTERNAL => {
            let payload = ExternalPayload::decode(environment.payload.as_slice()).ok()?;
            let url = payload.endpoint?.url;
            let address = url.split_once("://").map_or(url.as_str(), |(_, a)| a);
            return directory.need_of_address(address);
        }
        _ => return None,
    };
    directory.serves(need).then_some(need)
}

/// The environment that starts a worker of `original` on the pool at
/// `pool` (`host:port`): EXTERNAL, naming the pool, with `original`'s
/// capabilities and dependencies (what the SDK is told it may use).
pub fn pooled_environment(original: &Environment, pool: &str) -> Environment {
    let payload = ExternalPayload {
        endpoint: Some(ApiServiceDescriptor {
            url: pool.to_string(),
            authentication: None,
        }),
        params: Default::default(),
    };
    Environment {
        urn: urns::env::EXTERNAL.to_string(),
        payload: payload.encode_to_vec(),
        ..original.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use refract_proto::pipeline::{DockerPayload, ProcessPayload};

    fn docker(image: &str) -> Environment {
        Environment {
            urn: urns::env::DOCKER.to_string(),
            payload: DockerPayload {
                container_image: image.to_string(),
            }
            .encode_to_vec(),
            capabilities: vec!["beam:coder:bytes:v1".to_string()],
            ..Default::default()
        }
    }

    fn external(url: &str) -> Environment {
        Environment {
            urn: urns::env::EXTERNAL.to_string(),
            payload: ExternalPayload {
                endpoint: Some(ApiServiceDescriptor {
                    url: url.to_string(),
                    authentication: None,
                }),
                params: Default::default(),
            }
            .encode_to_vec(),
            ..Default::default()
        }
    }

    fn directory(specs: &[&str]) -> PoolDirectory {
        let d = PoolDirectory::new(2);
        for s in specs {
            let _stop = d.insert(s.parse().unwrap()).unwrap();
        }
        d
    }

    #[test]
    fn sdk_images_go_to_their_sdks_pools_and_others_to_unlabelled_ones() {
        let python = docker("apache/beam_python3.11_sdk:2.70.0");
        let java = docker("apache/beam_java17_sdk:2.70.0");
        let process = Environment {
            urn: urns::env::PROCESS.to_string(),
            payload: ProcessPayload::default().encode_to_vec(),
            ..Default::default()
        };
        let labelled = directory(&["python=10.0.0.2:50000"]);
        assert_eq!(
            pool_need(&python, &labelled),
            Some(PoolNeed {
                sdk: Some(BeamSdk::Python)
            })
        );
        assert_eq!(pool_need(&java, &labelled), None);
        assert_eq!(pool_need(&process, &labelled), None);
        let any = directory(&["10.0.0.3:50000"]);
        assert!(pool_need(&java, &any).is_some());
        assert_eq!(pool_need(&process, &any), Some(PoolNeed { sdk: None }));
        assert_eq!(pool_need(&python, &directory(&[])), None);
    }

    #[test]
    fn an_external_environment_naming_a_pool_uses_its_specs_pools() {
        let d = directory(&["java=10.0.0.2:7000"]);
        assert_eq!(
            pool_need(&external("10.0.0.2:7000"), &d),
            Some(PoolNeed {
                sdk: Some(BeamSdk::Java)
            })
        );
        assert_eq!(
            pool_need(&external("http://10.0.0.2:7000"), &d).map(|n| n.sdk),
            Some(Some(BeamSdk::Java))
        );
        assert_eq!(pool_need(&external("localhost:5555"), &d), None);
    }

    #[test]
    fn a_pooled_worker_starts_external_on_the_pool_with_the_same_capabilities() {
        let original = docker("apache/beam_python3.11_sdk:2.70.0");
        let pooled = pooled_environment(&original, "10.0.0.2:50000");
        assert_eq!(pooled.urn, urns::env::EXTERNAL);
        assert_eq!(pooled.capabilities, original.capabilities);
        let payload = ExternalPayload::decode(pooled.payload.as_slice()).unwrap();
        assert_eq!(payload.endpoint.unwrap().url, "10.0.0.2:50000");
    }
}
