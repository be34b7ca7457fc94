//! The crate's one error type, and the Toxiproxy status code of each variant.
//!
//! The messages start with Toxiproxy's own phrases ("proxy not found", "bad request
//! body", ...) so that anybody who knows Toxiproxy recognises them, followed by the
//! detail a learner needs ("proxy not found: payments").

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
            Error::ProxyAlreadyExists(_) | Error::ToxicAlreadyExists(_) => 409,
            // Somebody else already listens there: a conflict with existing state,
            // not a malformed request.
            Error::Listen { source, .. } if source.kind() == io::ErrorKind::AddrInUse => 409,
            // Everything else is caused by the request's content. We never answer
            // 500 for bad input.
            _ => 400,
        }
    }
}
