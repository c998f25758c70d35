//! Generates the gRPC code from `proto/` with protox, so a fresh machine needs
//! nothing but cargo (no system `protoc`).

use std::path::PathBuf;

use prost::Message as _;

fn main() -> anyhow::Result<()> {
    let files = [
        "proto/toolgate/v1/common.proto",
        "proto/toolgate/v1/authorization.proto",
        "proto/toolgate/v1/approval.proto",
        "proto/toolgate/v1/ledger.proto",
        "proto/toolgate/v1/policy.proto",
        "proto/toolgate/v1/entity.proto",
    ];
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(files, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    // The descriptor set serves gRPC server reflection.
    std::fs::write(out.join("toolgate_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .emit_rerun_if_changed(false)
        .compile_fds(fds)?;
    // Envoy's ext_authz service (DESIGN §11.2): its Rust types come from
    // the `envoy-types` crate; its files (the same protos as that crate's,
    // vendored under proto/envoy with every import) are compiled here only
    // for server reflection, which must list the service with every file
    // it depends on.
    let envoy = protox::compile(
        ["envoy/service/auth/v3/external_auth.proto"],
        ["proto/envoy"],
    )?;
    std::fs::write(out.join("envoy_descriptor.bin"), envoy.encode_to_vec())?;
    Ok(())
}
