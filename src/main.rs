//! The `vk-cocoon` binary: see `cli.rs` for its commands.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
