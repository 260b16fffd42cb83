//! Compiles Refract's own protos (the admin API, the exchange between
//! shards, the control plane of shard hosts); Beam's come generated from the `beam-proto` crate.

fn main() {
    let protos = [
        "refract/admin/v1/admin.proto",
        "refract/exchange/v1/exchange.proto",
        "refract/hosts/v1/hosts.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    println!("cargo:rerun-if-changed=build.rs");
    if let Err(error) = tonic_build::configure()
        .build_client(true)
        .build_server(true)
        // Elements cross the exchange without a copy into a Vec.
        .bytes([".refract.exchange.v1.Deliver.elements"])
        .compile_protos(&protos, &["."])
    {
        panic!("compiling {protos:?}: {error}");
    }
}
