//! The `toolgate` command line; its subcommands are in `toolgate::cli`.

fn main() -> std::process::ExitCode {
    toolgate::cli::main()
}
