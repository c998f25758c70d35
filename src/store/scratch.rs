//! A throwaway schema on a PostgreSQL server, for the test suite and the
//! benchmarks: each run gets a schema of its own (and, when asked, a role
//! of its own that owns it), so runs on one server never see each other's
//! rows, and everything is dropped afterwards. Not used when serving.

use std::str::FromStr;
use std::time::Duration;

use tokio_postgres::NoTls;

use super::StoreError;

/// The environment variable naming the server the tests use (an admin
/// URL: it may create schemas and roles).
pub const TEST_URL_VAR: &str = "TOOLGATE_TEST_POSTGRES";
/// The server the tests use when [`TEST_URL_VAR`] is not set.
pub const DEFAULT_TEST_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The admin URL of the test server.
#[must_use]
pub fn test_url() -> String {
    std::env::var(TEST_URL_VAR).unwrap_or_else(|_| DEFAULT_TEST_URL.to_owned())
}

/// A schema `tg_<random>` (and maybe a role of the same name), dropped when
/// this is dropped.
#[derive(Debug)]
pub struct ScratchSchema {
    admin_url: String,
    name: String,
    url: String,
    role: bool,
    app_role: bool,
}

impl ScratchSchema {
    /// Creates a schema on the server `admin_url` names.
    ///
    /// # Errors
    /// [`StoreError`] when the server cannot be reached in 5 s or refuses.
    pub async fn create(admin_url: &str) -> Result<Self, StoreError> {
        Self::make(admin_url, false).await
    }

    /// Creates a role that may log in and owns a new schema, nothing more
    /// (not a superuser), so tests can lock it out and let it back in.
    ///
    /// # Errors
    /// [`StoreError`] when the server cannot be reached in 5 s or refuses.
    pub async fn create_with_role(admin_url: &str) -> Result<Self, StoreError> {
        Self::make(admin_url, true).await
    }

    async fn make(admin_url: &str, role: bool) -> Result<Self, StoreError> {
        let name = format!("tg_{}", uuid::Uuid::new_v4().simple());
        let admin = connect(admin_url).await?;
        if role {
            admin
                .batch_execute(&format!(
                    "CREATE ROLE {name} LOGIN; CREATE SCHEMA {name} AUTHORIZATION {name}"
                ))
                .await?;
        } else {
            admin
                .batch_execute(&format!("CREATE SCHEMA {name}"))
                .await?;
        }
        let mut url = format!(
            "{admin_url}{}options=-csearch_path%3D{name}&application_name={name}",
            if admin_url.contains('?') { '&' } else { '?' }
        );
        if role {
            url.push_str(&format!("&user={name}"));
        }
        Ok(Self {
            admin_url: admin_url.to_owned(),
            name,
            url,
            role,
            app_role: false,
        })
    }

    /// The URL of the schema: its `search_path` and `application_name`
    /// (and user, with a role) set.
    #[must_use]
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The schema's (and role's) name; also the `application_name` of its
    /// connections.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Creates the role `<name>_app`, which may log in, use the schema and
    /// read and write the rows of its tables (and draw from its sequences),
    /// nothing more; returns the schema's URL as that role. Call it after
    /// the tables exist.
    ///
    /// # Errors
    /// [`StoreError`] when the server refuses.
    pub async fn create_app_role(&mut self) -> Result<String, StoreError> {
        let (schema, app) = (&self.name, format!("{}_app", self.name));
        let admin = connect(&self.admin_url).await?;
        admin
            .batch_execute(&format!(
                "CREATE ROLE {app} LOGIN; GRANT USAGE ON SCHEMA {schema} TO {app}; \
                 GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {app}; \
                 GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {app}"
            ))
            .await?;
        self.app_role = true;
        Ok(format!("{}&user={app}", self.url))
    }

    /// A new admin connection to the server.
    ///
    /// # Errors
    /// [`StoreError`] when the server cannot be reached in 5 s.
    pub async fn admin(&self) -> Result<tokio_postgres::Client, StoreError> {
        connect(&self.admin_url).await
    }

    fn drop_sql(&self) -> String {
        let mut sql = format!(
            "SET lock_timeout = '10s'; \
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{0}'; \
             DROP SCHEMA IF EXISTS {0} CASCADE;",
            self.name
        );
        if self.app_role {
            sql.push_str(&format!(
                " SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{0}_app'; \
                 DROP ROLE IF EXISTS {0}_app;",
                self.name
            ));
        }
        if self.role {
            sql.push_str(&format!(" DROP ROLE IF EXISTS {};", self.name));
        }
        sql
    }
}

impl Drop for ScratchSchema {
    fn drop(&mut self) {
        let (admin_url, sql) = (self.admin_url.clone(), self.drop_sql());
        // Drop may run inside a runtime, which cannot be blocked on: a
        // thread of its own with a small runtime does the cleanup.
        let cleanup = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async {
                match connect(&admin_url).await {
                    Ok(admin) => {
                        if let Err(e) = admin.batch_execute(&sql).await {
                            eprintln!("cannot drop a scratch schema: {e}");
                        }
                    }
                    Err(e) => eprintln!("cannot drop a scratch schema: {e}"),
                }
            });
        });
        let _ = cleanup.join();
    }
}

async fn connect(url: &str) -> Result<tokio_postgres::Client, StoreError> {
    let mut config = tokio_postgres::Config::from_str(url)
        .map_err(|_| StoreError::PostgresUrl("the test URL does not parse".into()))?;
    config.connect_timeout(Duration::from_secs(5));
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}
