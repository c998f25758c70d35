//! `toolgate dev keys` and `toolgate dev token`: DEVELOPMENT ONLY, a local
//! key set and identity tokens signed with it, to try the approval flow
//! without an identity provider.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;

use crate::identity::{DevSigner, generate_dev_keyset};

#[derive(clap::Subcommand)]
pub(super) enum DevCommand {
    /// Write a new development key set (one random HS256 secret) to a file
    /// readable only by its owner. Refuses to overwrite an existing file.
    Keys {
        #[arg(long, default_value = "toolgate-data/dev-jwks.json")]
        out: PathBuf,
    },
    /// Print an identity token signed with the development key set.
    Token(DevTokenArgs),
}

#[derive(clap::Args)]
pub(super) struct DevTokenArgs {
    #[arg(long, default_value = "toolgate-data/dev-jwks.json")]
    jwks: PathBuf,
    #[arg(long)]
    subject: String,
    #[arg(long)]
    tenant: String,
    #[arg(long = "role")]
    roles: Vec<String>,
    #[arg(long = "scope")]
    scopes: Vec<String>,
    #[arg(long, env = "TOOLGATE_ISSUER")]
    issuer: Option<String>,
    #[arg(long, env = "TOOLGATE_AUDIENCE")]
    audience: Option<String>,
    /// How long the token is valid.
    #[arg(long, default_value_t = 3600)]
    ttl_seconds: i64,
}

pub(super) fn run(command: DevCommand) -> anyhow::Result<ExitCode> {
    match command {
        DevCommand::Keys { out } => {
            write_keys(&out)?;
            eprintln!(
                "wrote a DEVELOPMENT key set to {}; it holds a signing secret: never use it in production\n\
                 serve with:  toolgate serve --jwks-file {}",
                out.display(),
                out.display()
            );
        }
        DevCommand::Token(args) => println!("{}", token(&args)?),
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes a new key set to `out`, readable only by its owner; never over
/// an existing file.
fn write_keys(out: &Path) -> anyhow::Result<()> {
    let (jwks, _signer) = generate_dev_keyset()?;
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(out).with_context(|| {
        format!(
            "creating {} (an existing key set is never overwritten)",
            out.display()
        )
    })?;
    std::io::Write::write_all(&mut file, jwks.as_bytes())
        .with_context(|| format!("writing {}", out.display()))
}

/// A token signed with the key set at `args.jwks`, valid from now.
fn token(args: &DevTokenArgs) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(&args.jwks).with_context(|| {
        format!(
            "reading {} (create it with `toolgate dev keys`)",
            args.jwks.display()
        )
    })?;
    let signer = DevSigner::from_jwks_json(&text)?;
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    Ok(signer.mint(
        &args.subject,
        &args.tenant,
        &args.roles,
        &args.scopes,
        args.issuer.as_deref(),
        args.audience.as_deref(),
        now,
        args.ttl_seconds,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_set_is_owner_only_and_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("keys/dev-jwks.json");
        write_keys(&out).unwrap();
        let first = std::fs::read(&out).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&out).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let again = write_keys(&out).unwrap_err();
        assert!(
            again
                .to_string()
                .ends_with("(an existing key set is never overwritten)"),
            "{again:#}"
        );
        assert_eq!(std::fs::read(&out).unwrap(), first);
    }

    #[test]
    fn a_token_is_three_base64url_parts() {
        let dir = tempfile::tempdir().unwrap();
        let jwks = dir.path().join("dev-jwks.json");
        write_keys(&jwks).unwrap();
        let args = DevTokenArgs {
            jwks,
            subject: "alice".into(),
            tenant: "acme".into(),
            roles: vec!["support_lead".into()],
            scopes: vec![],
            issuer: None,
            audience: None,
            ttl_seconds: 60,
        };
        let token = token(&args).unwrap();
        let parts: Vec<&str> = token.split('.').collect();
        assert_eq!(parts.len(), 3, "{token}");
        assert!(parts.iter().all(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        }));
    }
}
