//! A call as the lab's callers make it (the scenarios' `Caller`, the exercises' client): sent,
//! its whole answer read, and what happened on the wire told as a [`Wire`] for
//! [`lab_core::classify`], the one judgement of ok, fail or unknown.
//!
//! What an HTTP client's error means for the request is decided here, once: a refused
//! connection or one never made sent nothing; a timeout or a connection that ended after it was
//! made may have delivered the request.

use lab_core::{Answer, Wire, classify};

/// Sends `request` and reads its whole answer; what happened on the wire.
pub async fn exchange(request: reqwest::RequestBuilder) -> Wire {
    match request.send().await {
        Ok(response) => read_whole(response).await,
        Err(error) => wire_of_error(&error),
    }
}

/// [`exchange`], judged.
pub async fn call(request: reqwest::RequestBuilder) -> Answer {
    classify(exchange(request).await)
}

/// What a transport error means for the request: whether it could have been sent.
pub fn wire_of_error(error: &reqwest::Error) -> Wire {
    match (error.is_connect(), error.is_timeout()) {
        (true, true) => Wire::ConnectTimedOut,
        (true, false) => Wire::Refused,
        (false, true) => Wire::TimedOut,
        (false, false) => Wire::Dropped,
    }
}

/// Reads the whole answer; a body that does not come whole is no answer.
async fn read_whole(response: reqwest::Response) -> Wire {
    let status = response.status().as_u16();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let retry_after = header("retry-after");
    let replayed = header("idempotent-replayed").as_deref() == Some("true");
    match response.text().await {
        Ok(body) => Wire::Answered {
            status,
            retry_after,
            replayed,
            body,
        },
        // Headers came, the body did not (in time): the caller still does not know.
        Err(error) if error.is_timeout() => Wire::TimedOut,
        Err(_) => Wire::Dropped,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use lab_core::Outcome;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A server on a free port that answers every connection with `answer` (after reading the
    /// request), or holds it open without a word when `answer` is `None`.
    async fn server(answer: Option<&'static str>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let mut request = vec![0; 4096];
                    let _ = socket.read(&mut request).await;
                    match answer {
                        Some(bytes) => {
                            let _ = socket.write_all(bytes.as_bytes()).await;
                        }
                        // Holds the connection (and the request) without answering.
                        None => std::future::pending::<()>().await,
                    }
                });
            }
        });
        url
    }

    async fn post(url: &str, timeout: Duration) -> Answer {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .timeout(timeout)
            .build()
            .unwrap();
        call(client.post(url).body("{}")).await
    }

    const PATIENT: Duration = Duration::from_secs(10);

    #[tokio::test]
    async fn a_whole_answer_keeps_its_status_headers_and_body() {
        let url = server(Some(
            "HTTP/1.1 409 Conflict\r\nRetry-After: 1\r\nIdempotent-Replayed: true\r\n\
             content-length: 2\r\nconnection: close\r\n\r\n{}",
        ))
        .await;
        let answer = post(&url, PATIENT).await;
        assert_eq!(answer.outcome, Outcome::Fail);
        assert_eq!(answer.status, Some(409));
        assert_eq!(answer.retry_after.as_deref(), Some("1"));
        assert!(answer.replayed);
        assert_eq!(answer.body.as_deref(), Some("{}"));
    }

    #[tokio::test]
    async fn a_refused_connection_sent_nothing() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        drop(listener);
        let answer = post(&url, PATIENT).await;
        assert_eq!(answer.outcome, Outcome::Fail);
        assert_eq!(answer.detail, Some("call.refused"));
    }

    #[tokio::test]
    async fn no_answer_in_time_may_have_been_done() {
        let url = server(None).await;
        let answer = post(&url, Duration::from_millis(100)).await;
        assert_eq!(answer.outcome, Outcome::Unknown);
        assert_eq!(answer.detail, Some("call.timed_out"));
    }

    #[tokio::test]
    async fn a_connection_closed_before_a_whole_answer_may_have_been_done() {
        // Closed after the request, without a word.
        let url = server(Some("")).await;
        let answer = post(&url, PATIENT).await;
        assert_eq!(answer.outcome, Outcome::Unknown);
        assert_eq!(answer.detail, Some("call.dropped"));
        // Headers, then the connection ends before the body promised.
        let url = server(Some(
            "HTTP/1.1 201 Created\r\ncontent-length: 100\r\n\r\n{\"report_id\":",
        ))
        .await;
        let answer = post(&url, PATIENT).await;
        assert_eq!(answer.outcome, Outcome::Unknown);
        assert_eq!(answer.status, None, "no whole answer, no status");
        assert_eq!(answer.detail, Some("call.dropped"));
    }
}
