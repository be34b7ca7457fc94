//! How a `lab` talks to a board: a learner's joins and verdicts, the instructor's verified
//! verdicts. Every call has a short deadline: a board that is down costs a learner a few
//! seconds at most, and never a verdict or an exit code (the caller says one line and goes on).

use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::model::{JoinRequest, Joined, VerdictPost, VerifiedPost};

/// How long one request to the board may take, connection included: a classroom network is
/// slow at times, and a learner waits for it after their checks.
const DEADLINE: Duration = Duration::from_secs(3);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("`{0}` is not a board's URL (http://HOST:PORT/)")]
    BadUrl(String),
    #[error("it cannot be reached ({reason})")]
    Unreachable { url: String, reason: String },
    #[error("the board refused it ({status}): {message}")]
    Refused { status: u16, message: String },
}

/// What went wrong under a request's error: reqwest's own words ("error sending request")
/// say less than the cause at the bottom of the chain ("Connection refused").
fn cause(error: &reqwest::Error) -> String {
    let mut cause: &dyn std::error::Error = error;
    while let Some(next) = cause.source() {
        cause = next;
    }
    if error.is_timeout() {
        format!("no answer within {} s", DEADLINE.as_secs())
    } else {
        cause.to_string()
    }
}

impl ClientError {
    /// The status of a refusal (`None` when the board was not reached).
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Refused { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A board's client.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: url::Url,
}

impl Client {
    /// A client of the board at `url` (`http://…`; a path after the host is ignored).
    pub fn new(url: &str) -> Result<Client, ClientError> {
        let bad = || ClientError::BadUrl(url.to_string());
        let base = url::Url::parse(url).map_err(|_| bad())?;
        if !matches!(base.scheme(), "http" | "https") || base.host_str().is_none() {
            return Err(bad());
        }
        let http = reqwest::Client::builder()
            .timeout(DEADLINE)
            .connect_timeout(DEADLINE)
            .build()
            .map_err(|e| ClientError::Unreachable {
                url: url.to_string(),
                reason: e.to_string(),
            })?;
        Ok(Client { http, base })
    }

    /// The board's URL, as the learner is told it.
    pub fn url(&self) -> &str {
        self.base.as_str()
    }

    async fn post<T: Serialize>(
        &self,
        path: &str,
        token: Option<&str>,
        body: &T,
    ) -> Result<Value, ClientError> {
        let url = self
            .base
            .join(path)
            .map_err(|_| ClientError::BadUrl(path.into()))?;
        let mut request = self.http.post(url).json(body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let unreachable = |e: reqwest::Error| ClientError::Unreachable {
            url: self.base.to_string(),
            reason: cause(&e),
        };
        let response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(body);
        }
        Err(ClientError::Refused {
            status: status.as_u16(),
            message: body["error"]
                .as_str()
                .unwrap_or("no reason given")
                .to_string(),
        })
    }

    /// Joins the class with its code under `name`: the learner's token.
    pub async fn join(&self, code: &str, name: &str) -> Result<Joined, ClientError> {
        let body = self
            .post(
                "/api/join",
                None,
                &JoinRequest {
                    code: code.to_string(),
                    name: name.to_string(),
                },
            )
            .await?;
        serde_json::from_value(body).map_err(|e| ClientError::Refused {
            status: 200,
            message: format!("the board answered a join with something else: {e}"),
        })
    }

    /// One verdict of the learner whose token this is.
    pub async fn send(&self, token: &str, verdict: &VerdictPost) -> Result<(), ClientError> {
        self.post("/api/verdicts", Some(token), verdict)
            .await
            .map(drop)
    }

    /// The learners' names, as the instructor's token shows them: a refusal if the token is
    /// not the instructor's.
    pub async fn learner_names(&self, instructor_token: &str) -> Result<Vec<String>, ClientError> {
        let url = self
            .base
            .join("/api/board")
            .map_err(|_| ClientError::BadUrl(self.base.to_string()))?;
        let unreachable = |e: reqwest::Error| ClientError::Unreachable {
            url: self.base.to_string(),
            reason: cause(&e),
        };
        let response = self
            .http
            .get(url)
            .bearer_auth(instructor_token)
            .send()
            .await
            .map_err(unreachable)?;
        let status = response.status().as_u16();
        let board: Value = response.json().await.map_err(unreachable)?;
        if board["instructor"] != Value::Bool(true) {
            return Err(ClientError::Refused {
                status: if status == 200 { 403 } else { status },
                message: "the token is not this board's instructor token".into(),
            });
        }
        Ok(board["learners"]
            .as_array()
            .map(|learners| {
                learners
                    .iter()
                    .filter_map(|l| l["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// One verdict the instructor's lab reached against `learner`'s service.
    pub async fn send_verified(
        &self,
        instructor_token: &str,
        learner: &str,
        verdict: &VerdictPost,
    ) -> Result<(), ClientError> {
        let body = VerifiedPost {
            learner: learner.to_string(),
            verdict: verdict.clone(),
        };
        self.post("/api/verified", Some(instructor_token), &body)
            .await
            .map(drop)
    }
}
