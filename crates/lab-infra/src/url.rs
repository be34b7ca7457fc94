//! Server URLs as learners have them, parsed with the `url` crate.
//!
//! The PostgreSQL lesson tells learners to export the SQLAlchemy form
//! `postgresql+psycopg://user:pass@host/db`; the lab accepts it (the `+driver` part names a
//! Python driver and means nothing to us) as well as `postgres://` and `postgresql://`, with
//! whatever query the URL carries (`?sslmode=disable`, `?options=...`).
//!
//! Two readers see these URLs, and they decode queries differently: sqlx (form decoding, where
//! `+` is a space) and libpq, i.e. `psql` (percent-decoding only, where `+` stays `+`). So
//! whatever the lab writes into a query is percent-encoded, spaces as `%20`, which both read the
//! same way; and the pairs already there are left exactly as they were written.

use sqlx::postgres::PgConnectOptions;
use url::Url;
use url::form_urlencoded::{byte_serialize, parse};

use crate::InfraError;

/// A PostgreSQL to connect to, parsed once from the URL a learner gave (or a throwaway server's):
/// the URL as sqlx and psql read it, and sqlx's connect options made from it. Everything that
/// connects, names the server in a message or prints a psql line works from this one value.
#[derive(Clone)]
pub struct PgTarget {
    url: String,
    options: PgConnectOptions,
}

impl PgTarget {
    /// Accepts the forms learners are told to export (see [`normalize_postgres`]).
    pub fn parse(given: &str) -> Result<PgTarget, InfraError> {
        let url = normalize_postgres(given)?;
        let options = url.parse().map_err(|e: sqlx::Error| InfraError::BadUrl {
            server: "PostgreSQL",
            url: redact(given),
            reason: e.to_string(),
        })?;
        Ok(PgTarget { url, options })
    }

    /// The URL, scheme `postgresql`, password included: for connecting, never for printing.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn options(&self) -> &PgConnectOptions {
        &self.options
    }

    /// The URL with its password hidden: for messages.
    pub fn redacted(&self) -> String {
        redact(&self.url)
    }

    /// The URL a program the lab starts for a learner (`lab exercise`) connects with: the
    /// run's schema as its `search_path`, in `options`, which libpq (psycopg, psql) and sqlx
    /// both read; the password, if any, kept, since that program cannot be asked for it.
    pub fn guest_url(&self, schema: &str) -> Result<String, InfraError> {
        with_search_path(&self.url, schema)
    }

    /// The URL a learner gives `psql` to look at a run's schema, password hidden (psql asks
    /// for it, or reads PGPASSWORD).
    pub fn psql_url(&self, schema: &str) -> Result<String, InfraError> {
        Ok(redact(&with_search_path(&self.url, schema)?))
    }
}

impl std::fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("PgTarget").field(&self.redacted()).finish()
    }
}

const POSTGRES_FORM: &str = "expected postgresql://user@host:port/database";

/// Turns any accepted PostgreSQL URL into one sqlx (and psql) understands: the same URL with
/// the scheme `postgresql`.
pub fn normalize_postgres(given: &str) -> Result<String, InfraError> {
    let bad = |reason: String| InfraError::BadUrl {
        server: "PostgreSQL",
        url: redact(given),
        reason,
    };
    let mut url = Url::parse(given).map_err(|e| bad(format!("{POSTGRES_FORM} ({e})")))?;
    let base = url.scheme().split('+').next().unwrap_or_default();
    if base != "postgres" && base != "postgresql" {
        return Err(bad(
            "the scheme must be postgresql:// (or postgresql+driver://)".to_string(),
        ));
    }
    // `postgresql:db` parses as a URL, but names no server.
    if !url.has_authority() {
        return Err(bad(POSTGRES_FORM.to_string()));
    }
    // Both schemes are "non-special" to the URL standard, so this cannot fail.
    url.set_scheme("postgresql")
        .map_err(|()| bad(POSTGRES_FORM.to_string()))?;
    Ok(url.into())
}

/// Checks a Redis URL: `redis://`, or a socket (`unix://`, `redis+unix://`).
pub fn check_redis(given: &str) -> Result<String, InfraError> {
    match Url::parse(given) {
        Ok(url) if matches!(url.scheme(), "redis" | "unix" | "redis+unix") => Ok(url.into()),
        _ => Err(InfraError::BadUrl {
            server: "Redis",
            url: redact(given),
            reason: "expected redis://host:port".to_string(),
        }),
    }
}

/// The PostgreSQL URL `server_url` with `schema` as `search_path`, for psql: libpq's `options`
/// query parameter, `-csearch_path=<schema>`, added to the query the URL has (to the `options`
/// it has, if any, which libpq would otherwise replace).
pub fn with_search_path(server_url: &str, schema: &str) -> Result<String, InfraError> {
    let mut url = Url::parse(server_url).map_err(|e| InfraError::BadUrl {
        server: "PostgreSQL",
        url: redact(server_url),
        reason: e.to_string(),
    })?;
    let setting = format!("-csearch_path={schema}");
    let mut added = false;
    let mut pairs: Vec<String> = url
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| match parse(pair.as_bytes()).next() {
            Some((key, value)) if key == "options" && !added => {
                added = true;
                format!("options={}", encode(&format!("{value} {setting}")))
            }
            _ => pair.to_string(),
        })
        .collect();
    if !added {
        pairs.push(format!("options={}", encode(&setting)));
    }
    url.set_query(Some(&pairs.join("&")));
    Ok(url.into())
}

/// Percent-encodes a query value so that sqlx and libpq decode it alike (see the module doc).
fn encode(value: &str) -> String {
    // byte_serialize writes a space as `+` and a real `+` as `%2B`: every `+` is a space.
    byte_serialize(value.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

/// Hides the password in a URL (in its user info or a `password` query parameter, which sqlx
/// and libpq also take) before it is printed.
pub fn redact(given: &str) -> String {
    let Ok(mut url) = Url::parse(given) else {
        return redact_unparsed(given);
    };
    let mut changed = false;
    if url.password().is_some() {
        changed = url.set_password(Some("***")).is_ok();
    }
    if url.query_pairs().any(|(key, _)| key == "password") {
        let query = url
            .query()
            .unwrap_or_default()
            .split('&')
            .map(|pair| match parse(pair.as_bytes()).next() {
                Some((key, _)) if key == "password" => "password=***".to_string(),
                _ => pair.to_string(),
            })
            .collect::<Vec<_>>()
            .join("&");
        url.set_query(Some(&query));
        changed = true;
    }
    // A URL without secrets is shown as it was given, not as the parser rewrites it.
    if changed {
        url.into()
    } else {
        given.to_string()
    }
}

/// [`redact`] for text that is not a URL at all: whatever sits between `://` and the last `@`
/// before the path may be credentials, so the part after a `:` there is hidden.
fn redact_unparsed(given: &str) -> String {
    let Some((scheme, rest)) = given.split_once("://") else {
        return given.to_string();
    };
    let (authority, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => given.to_string(),
        },
        None => given.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_sqlalchemy_form() {
        assert_eq!(
            normalize_postgres("postgresql+psycopg://u:p@localhost:5432/lab").unwrap(),
            "postgresql://u:p@localhost:5432/lab"
        );
        assert_eq!(
            normalize_postgres("postgres://localhost/test").unwrap(),
            "postgresql://localhost/test"
        );
        assert_eq!(
            normalize_postgres("postgresql://postgres@127.0.0.1:5432/test").unwrap(),
            "postgresql://postgres@127.0.0.1:5432/test"
        );
    }

    #[test]
    fn keeps_the_query() {
        assert_eq!(
            normalize_postgres("postgresql+psycopg://u@h:5432/db?sslmode=disable").unwrap(),
            "postgresql://u@h:5432/db?sslmode=disable"
        );
        assert_eq!(
            normalize_postgres("postgres://u@h/db?sslmode=require&application_name=x").unwrap(),
            "postgresql://u@h/db?sslmode=require&application_name=x"
        );
    }

    #[test]
    fn rejects_other_schemes() {
        assert!(normalize_postgres("mysql://localhost/test").is_err());
        assert!(normalize_postgres("localhost:5432").is_err());
        assert!(normalize_postgres("postgresql:test").is_err());
        assert!(normalize_postgres("").is_err());
        assert!(check_redis("http://localhost:6379").is_err());
        assert!(check_redis("localhost:6379").is_err());
        assert_eq!(
            check_redis("redis://127.0.0.1:6379").unwrap(),
            "redis://127.0.0.1:6379"
        );
        assert!(check_redis("unix:///run/redis.sock").is_ok());
    }

    #[test]
    fn an_error_does_not_show_the_password() {
        let err = normalize_postgres("mysql://u:secret@h/db").unwrap_err();
        assert!(!err.to_string().contains("secret"), "{err}");
        let err = check_redis("http://u:secret@h:6379").unwrap_err();
        assert!(!err.to_string().contains("secret"), "{err}");
    }

    #[test]
    fn adds_the_search_path_as_a_query_pair() {
        assert_eq!(
            with_search_path(
                "postgresql://postgres@127.0.0.1:5432/postgres",
                "lab_0a1b2c3d"
            )
            .unwrap(),
            "postgresql://postgres@127.0.0.1:5432/postgres?options=-csearch_path%3Dlab_0a1b2c3d"
        );
    }

    #[test]
    fn adds_the_search_path_to_an_existing_query() {
        assert_eq!(
            with_search_path("postgresql://u@h:5432/db?sslmode=disable", "lab_0a1b2c3d").unwrap(),
            "postgresql://u@h:5432/db?sslmode=disable&options=-csearch_path%3Dlab_0a1b2c3d"
        );
        // Pairs already there keep their spelling, `+` included.
        assert_eq!(
            with_search_path(
                "postgresql://u@h/db?application_name=a+b&sslmode=require",
                "s"
            )
            .unwrap(),
            "postgresql://u@h/db?application_name=a+b&sslmode=require&options=-csearch_path%3Ds"
        );
    }

    #[test]
    fn merges_the_search_path_into_existing_options() {
        let url = with_search_path(
            "postgresql://u@h/db?options=-cstatement_timeout%3D5s&sslmode=disable",
            "lab_0a1b2c3d",
        )
        .unwrap();
        assert_eq!(
            url,
            "postgresql://u@h/db?options=-cstatement_timeout%3D5s%20-csearch_path%3Dlab_0a1b2c3d\
             &sslmode=disable"
        );
        // What sqlx reads back: one `options` value with both settings.
        let parsed = Url::parse(&url).unwrap();
        let options: Vec<_> = parsed
            .query_pairs()
            .filter(|(k, _)| k == "options")
            .map(|(_, v)| v.into_owned())
            .collect();
        assert_eq!(
            options,
            ["-cstatement_timeout=5s -csearch_path=lab_0a1b2c3d"]
        );
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact("postgresql://u:secret@h:5432/db"),
            "postgresql://u:***@h:5432/db"
        );
        assert_eq!(
            redact("postgresql+psycopg://lab:s3cr%40t@db.example:5432/lab?sslmode=disable"),
            "postgresql+psycopg://lab:***@db.example:5432/lab?sslmode=disable"
        );
        assert_eq!(
            redact("redis://:secret@127.0.0.1:6379/0"),
            "redis://:***@127.0.0.1:6379/0"
        );
        assert_eq!(
            redact("postgresql://u@h/db?password=secret&sslmode=disable"),
            "postgresql://u@h/db?password=***&sslmode=disable"
        );
    }

    #[test]
    fn leaves_urls_without_passwords_as_given() {
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(
            redact("postgresql://u@h:5432/db?sslmode=disable"),
            "postgresql://u@h:5432/db?sslmode=disable"
        );
        assert_eq!(redact("not a url"), "not a url");
    }

    #[test]
    fn redacts_what_does_not_parse() {
        assert_eq!(
            redact("postgresql://u:secret@h:port/db"),
            "postgresql://u:***@h:port/db"
        );
    }
}
