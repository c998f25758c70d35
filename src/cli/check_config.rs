//! `toolgate check-config`: the configuration loaded and validated as
//! `serve` would (file, `TOOLGATE_*` environment, flags), without serving.

use std::process::ExitCode;

use super::serve::ServeArgs;
use crate::access::AccessPolicy;
use crate::config::Config;

pub(super) fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let config = args.load()?;
    println!("{}", summary(&config));
    Ok(ExitCode::SUCCESS)
}

/// The one line `check-config` prints for a valid configuration.
fn summary(config: &Config) -> String {
    format!(
        "ok: listen {:?}, {} access grant(s), dns-rebinding guard {}, audit {:?}, metrics {}",
        config.listen,
        match &config.access {
            AccessPolicy::Open => 0,
            AccessPolicy::Grants(g) => g.len(),
        },
        if config.rebinding_guard() {
            "on"
        } else {
            "off"
        },
        config.audit.sink,
        config
            .metrics_listen
            .map_or_else(|| "off".to_owned(), |a| a.to_string())
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Overrides;

    #[test]
    fn the_defaults_are_summarised_in_one_line() {
        let config = Config::with_defaults(Overrides::default()).unwrap();
        let line = summary(&config);
        assert!(
            line.starts_with(
                "ok: listen Tcp(\"127.0.0.1:50051\"), 0 access grant(s), dns-rebinding guard on, audit "
            ),
            "{line}"
        );
        assert!(line.ends_with(", metrics off"), "{line}");
    }
}
