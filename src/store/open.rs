//! Which backend a store URL names, opened: the one place that knows every
//! backend.

use std::sync::Arc;

use super::{PostgresStore, SqliteStore, Store, StoreError, StoreSettings};

/// Opens the store a URL names: `sqlite:///path/file.db` (or a bare path),
/// or `postgres://…` / `postgresql://…` (connected and migrated before this
/// returns; `settings` apply to it).
///
/// # Errors
/// [`StoreError`] for an unsupported URL or a database that cannot be
/// opened or migrated.
pub async fn open(url: &str, settings: StoreSettings) -> Result<Arc<dyn Store>, StoreError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(Arc::new(PostgresStore::connect(url, settings).await?));
    }
    let path = match url.strip_prefix("sqlite://") {
        Some(path) => path,
        None if url.contains("://") => return Err(StoreError::UnsupportedUrl(url.to_owned())),
        None => url,
    };
    let path = std::path::PathBuf::from(path);
    let store = tokio::task::spawn_blocking(move || SqliteStore::open(&path))
        .await
        .map_err(|e| StoreError::Task(e.to_string()))??;
    Ok(Arc::new(store))
}
