//! Server URLs as learners have them.
//!
//! The PostgreSQL lesson tells learners to export the SQLAlchemy form
//! `postgresql+psycopg://user:pass@host/db`; the lab accepts it (the `+driver` part names a
//! Python driver and means nothing to us) as well as `postgres://` and `postgresql://`.

use crate::InfraError;

/// Turns any accepted PostgreSQL URL into one sqlx understands.
pub fn normalize_postgres(url: &str) -> Result<String, InfraError> {
    let bad = |reason: &str| InfraError::BadUrl {
        server: "PostgreSQL",
        url: redact(url),
        reason: reason.to_string(),
    };
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad("expected postgresql://user@host:port/database"))?;
    let base = scheme.split('+').next().unwrap_or_default();
    match base {
        "postgres" | "postgresql" => Ok(format!("postgresql://{rest}")),
        _ => Err(bad(
            "the scheme must be postgresql:// (or postgresql+driver://)",
        )),
    }
}

/// Checks a Redis URL's scheme.
pub fn check_redis(url: &str) -> Result<String, InfraError> {
    if url.starts_with("redis://") || url.starts_with("unix://") || url.starts_with("redis+unix://")
    {
        Ok(url.to_string())
    } else {
        Err(InfraError::BadUrl {
            server: "Redis",
            url: redact(url),
            reason: "expected redis://host:port".to_string(),
        })
    }
}

/// Hides a password in a URL before it is printed.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_string(),
        },
        None => url.to_string(),
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
    }

    #[test]
    fn rejects_other_schemes() {
        assert!(normalize_postgres("mysql://localhost/test").is_err());
        assert!(normalize_postgres("localhost:5432").is_err());
        assert!(check_redis("http://localhost:6379").is_err());
        assert!(check_redis("redis://127.0.0.1:6379").is_ok());
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact("postgresql://u:secret@h:5432/db"),
            "postgresql://u:***@h:5432/db"
        );
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
    }
}
