//! Compiles Refract's own protos (the admin API); Beam's come generated
//! from the `beam-proto` crate.

fn main() {
    let proto = "refract/admin/v1/admin.proto";
    println!("cargo:rerun-if-changed={proto}");
    println!("cargo:rerun-if-changed=build.rs");
    if let Err(error) = tonic_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(&[proto], &["."])
    {
        panic!("compiling {proto}: {error}");
    }
}
