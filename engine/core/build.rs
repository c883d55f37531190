//! The shards' internal API and the public one, from proto/ (the one source of both): message
//! types compiled with protox (no protoc needed), the gRPC calls written in `remote.rs`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = "../../proto";
    println!("cargo:rerun-if-changed={root}/shard.proto");
    println!("cargo:rerun-if-changed={root}/qstate.proto");
    let fds = protox::compile(["shard.proto", "qstate.proto"], [root])?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
