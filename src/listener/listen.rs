//! Binding the listeners: TCP, and Unix domain sockets created owner-only.
//!
//! A Unix socket is bound inside a fresh owner-only directory, given its
//! mode, then renamed into place, so no other user can connect in the
//! moment between `bind` and `chmod`. An existing file at the path is
//! replaced only if it is a socket nobody listens on (a stale one left by a
//! crash); a live socket or any other kind of file is an error.

use std::path::{Path, PathBuf};

/// Why a listener cannot be bound.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum ListenError {
    #[error("`{}` exists and is not a socket; refusing to replace it", .0.display())]
    NotASocket(PathBuf),
    #[error("another process is listening on `{}`", .0.display())]
    InUse(PathBuf),
    #[error("cannot bind `{}`: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ListenError + '_ {
    move |source| ListenError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Binds a Unix domain socket at `path` with permission bits `mode`.
///
/// # Errors
/// [`ListenError`] when the path holds something that is not a stale
/// socket, or the socket cannot be created.
#[cfg(unix)]
pub fn bind_unix(path: &Path, mode: u32) -> Result<tokio::net::UnixListener, ListenError> {
    use std::os::unix::fs::{DirBuilderExt as _, FileTypeExt as _, PermissionsExt as _};

    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(ListenError::NotASocket(path.to_path_buf()));
        }
        Ok(_) => match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => return Err(ListenError::InUse(path.to_path_buf())),
            // Nobody listens: a stale socket, replaced by the rename below.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
            Err(e) => return Err(io(path)(e)),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(path)(e)),
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| Path::new("."));
    let staging = parent.join(format!(".toolgate-bind-{}", uuid::Uuid::new_v4().simple()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&staging)
        .map_err(io(&staging))?;
    let result = (|| {
        let tmp = staging.join("s");
        let listener = std::os::unix::net::UnixListener::bind(&tmp).map_err(io(&tmp))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).map_err(io(&tmp))?;
        std::fs::rename(&tmp, path).map_err(io(path))?;
        listener.set_nonblocking(true).map_err(io(path))?;
        tokio::net::UnixListener::from_std(listener).map_err(io(path))
    })();
    let _ = std::fs::remove_dir_all(&staging);
    result
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[tokio::test]
    async fn owner_only_stale_replaced_live_and_files_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tg.sock");
        let first = bind_unix(&path, 0o600).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // A live socket is not taken over.
        assert!(matches!(
            bind_unix(&path, 0o600),
            Err(ListenError::InUse(p)) if p == path
        ));
        // Once its listener is gone, the file is stale and replaced.
        drop(first);
        let _second = bind_unix(&path, 0o600).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // A regular file is never removed.
        let file = dir.path().join("data.db");
        std::fs::write(&file, b"keep").unwrap();
        assert!(matches!(
            bind_unix(&file, 0o600),
            Err(ListenError::NotASocket(p)) if p == file
        ));
        assert_eq!(std::fs::read(&file).unwrap(), b"keep");
        // No staging directory is left behind.
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with(".toolgate-bind"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
