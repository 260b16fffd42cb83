//! Beam names a gRPC endpoint by an `ApiServiceDescriptor` whose `url` is
//! usually a bare `host:port`; tonic dials URIs. One rule turns the first
//! into the second for every client Refract opens.

/// The URI to dial for an endpoint given as `host:port` (plain HTTP/2, as
/// Beam's endpoints are) or as a full URI, which is kept.
pub fn endpoint_uri(endpoint: &str) -> String {
    if endpoint.contains("://") {
        endpoint.to_string()
    } else {
        format!("http://{endpoint}")
    }
}

#[cfg(test)]
mod tests {
    use super::endpoint_uri;

    #[test]
    fn a_bare_address_is_dialled_over_http_and_a_uri_is_kept() {
        assert_eq!(endpoint_uri("127.0.0.1:4000"), "http://127.0.0.1:4000");
        assert_eq!(endpoint_uri("https://runner:443"), "https://runner:443");
        assert_eq!(endpoint_uri("unix:///tmp/fn.sock"), "unix:///tmp/fn.sock");
    }
}
