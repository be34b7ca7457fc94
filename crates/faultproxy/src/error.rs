//! The crate's one error type, its HTTP status, and the words Toxiproxy uses for it.
//!
//! An error has two texts:
//!
//! * its `Display`, for Rust callers and logs: Toxiproxy's phrase followed by the detail a
//!   learner needs ("proxy not found: payments");
//! * [`Error::toxiproxy_message`], what the HTTP API answers in `{"error": …}`: exactly the
//!   words a real Toxiproxy 2.x answers ("proxy not found"), because clients compare them
//!   (the Go client's own tests expect `Delete: HTTP 404: proxy not found`, toxiproxy-cli
//!   prints them). Where Toxiproxy itself adds a detail (`missing required field: name`,
//!   `bad request body: …`, a failed `listen tcp …`), so do we.

use std::io;

/// Everything that can go wrong when configuring proxies, toxics or faults.
///
/// Network trouble on a proxied connection is not an `Error`: it is the product.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("proxy not found: {0}")]
    ProxyNotFound(String),

    #[error("proxy already exists: {0}")]
    ProxyAlreadyExists(String),

    #[error("toxic not found: {0}")]
    ToxicNotFound(String),

    #[error("toxic already exists: {0}")]
    ToxicAlreadyExists(String),

    #[error("invalid toxic type: {0:?}")]
    InvalidToxicType(String),

    #[error("stream was invalid, can be either upstream or downstream: {0:?}")]
    InvalidStream(String),

    #[error(
        "bad request body: attribute {attribute:?} of a {toxic_type} toxic must be a non-negative integer"
    )]
    InvalidAttribute {
        toxic_type: String,
        attribute: String,
    },

    #[error("bad request body: toxicity must be between 0 and 1, got {0}")]
    InvalidToxicity(f32),

    #[error("bad request body: {0}")]
    BadRequestBody(String),

    #[error("missing required field: {0}")]
    MissingField(String),

    #[error("invalid address {address:?}: {reason}")]
    InvalidAddress { address: String, reason: String },

    /// Binding the listen address failed (taken, not ours to bind, ...).
    #[error("cannot listen on {address}: {source}")]
    Listen {
        address: String,
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// The HTTP status Toxiproxy answers with for this error.
    pub fn status_code(&self) -> u16 {
        match self {
            Error::ProxyNotFound(_) | Error::ToxicNotFound(_) => 404,
            // 409 means "that name exists", nothing else: clients (and the Go client's tests)
            // read it that way.
            Error::ProxyAlreadyExists(_) | Error::ToxicAlreadyExists(_) => 409,
            // Toxiproxy answers 500 for every failure to listen, a taken port included: it is
            // the machine that says no, not the request that is malformed.
            Error::Listen { .. } => 500,
            // Everything else is caused by the request's content.
            _ => 400,
        }
    }

    /// The message a real Toxiproxy puts in its error body for this error, word for word.
    pub fn toxiproxy_message(&self) -> String {
        match self {
            Error::ProxyNotFound(_) => "proxy not found".into(),
            Error::ProxyAlreadyExists(_) => "proxy already exists".into(),
            Error::ToxicNotFound(_) => "toxic not found".into(),
            Error::ToxicAlreadyExists(_) => "toxic already exists".into(),
            Error::InvalidToxicType(_) => "invalid toxic type".into(),
            Error::InvalidStream(_) => {
                "stream was invalid, can be either upstream or downstream".into()
            }
            // Go's net.Listen error, as Toxiproxy passes it on:
            // `listen tcp 127.0.0.1:3310: bind: address already in use`.
            Error::Listen { address, source } => {
                format!("listen tcp {address}: bind: {}", go_errno_text(source))
            }
            // These already read as Toxiproxy's ("bad request body: …", "missing required
            // field: …"), or are our own (an address we could not resolve).
            other => other.to_string(),
        }
    }
}

/// An OS error as Go prints it: the C library's text in lower case, without Rust's
/// " (os error N)".
fn go_errno_text(error: &io::Error) -> String {
    match error.kind() {
        io::ErrorKind::AddrInUse => "address already in use".into(),
        io::ErrorKind::AddrNotAvailable => "cannot assign requested address".into(),
        io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => {
            let text = error.to_string();
            let text = text.split(" (os error").next().unwrap_or(&text);
            text.to_lowercase()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_messages_are_toxiproxys_words() {
        assert_eq!(
            Error::ProxyNotFound("db".into()).toxiproxy_message(),
            "proxy not found"
        );
        assert_eq!(
            Error::MissingField("name".into()).toxiproxy_message(),
            "missing required field: name"
        );
        let taken = Error::Listen {
            address: "127.0.0.1:3310".into(),
            source: io::Error::from(io::ErrorKind::AddrInUse),
        };
        assert_eq!(taken.status_code(), 500);
        assert_eq!(
            taken.toxiproxy_message(),
            "listen tcp 127.0.0.1:3310: bind: address already in use"
        );
    }
}
