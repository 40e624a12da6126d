//! Honouring the API server's `429 Too Many Requests`: a tower layer in the
//! client stack that remembers the `Retry-After` of the last 429 and sends
//! nothing until it has passed.
//!
//! Why a layer: kube-rs turns an error answer into `kube::Error::Api`,
//! which keeps the status but not the headers, and `Retry-After` is a
//! header (API Priority and Fairness answers a rejection with
//! `Retry-After: N`, N whole seconds, 1 to 32, and a plain-text body; see
//! `apiserver/pkg/server/filters/priority-and-fairness.go`). The layer sees
//! every request of its client (GET, LIST, PUT, POST, watch), so one
//! throttled client sends at most one request per `Retry-After` whichever
//! verb asks, and a request asked for earlier is answered here, unsent,
//! with a 429 of its own, as if the server had refused it again. The
//! Elector still owns the timing: it waits what [`Throttle::left`] says
//! before it asks again, and its own deadlines (the renew deadline, the
//! step-down at `valid_until`) run on regardless.
//!
//! Rules: a 429 without a usable `Retry-After` (absent, or an HTTP date)
//! counts as 1 s (client-go's default); a longer one is capped at the
//! client's longest wait (the renew interval for the Lease backend), so a
//! throttled leader still renews once per renew interval.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::{Request, Response, StatusCode, header};
use tokio::time::Instant;
use tower::{BoxError, Layer, Service};

/// What a 429 without a usable `Retry-After` asks for (client-go's default).
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The longest wait a [`Throttle`] keeps unless told otherwise: a third of
/// client-go's default 15 s lease duration (its renew interval).
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(5);

/// When one client may send again after a 429. Cheap to clone; the clones
/// share the window.
#[derive(Clone, Debug)]
pub struct Throttle(Arc<Mutex<Window>>);

#[derive(Debug)]
struct Window {
    /// No request before this instant.
    until: Option<Instant>,
    /// The cap of one wait.
    max_wait: Duration,
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle::new(DEFAULT_MAX_WAIT)
    }
}

impl Throttle {
    /// A throttle that waits at most `max_wait` after one 429.
    pub fn new(max_wait: Duration) -> Throttle {
        Throttle(Arc::new(Mutex::new(Window {
            until: None,
            max_wait,
        })))
    }

    /// Cap every later wait at `max_wait` (the renew interval).
    pub fn set_max_wait(&self, max_wait: Duration) {
        self.0.lock().expect("throttle poisoned").max_wait = max_wait;
    }

    /// How long this client must still wait before its next request;
    /// `None` when it may send now.
    pub fn left(&self) -> Option<Duration> {
        let until = self.0.lock().expect("throttle poisoned").until?;
        let left = until.saturating_duration_since(Instant::now());
        (!left.is_zero()).then_some(left)
    }

    /// The server answered 429 with `retry_after` (capped): wait that long
    /// from now.
    fn told(&self, retry_after: Duration) {
        let mut w = self.0.lock().expect("throttle poisoned");
        let until = Instant::now() + retry_after.min(w.max_wait);
        w.until = Some(w.until.map_or(until, |u| u.max(until)));
    }

    /// The layer that feeds this throttle and holds requests back.
    pub fn layer(&self) -> ThrottleLayer {
        ThrottleLayer(self.clone())
    }
}

/// The `Retry-After` of an answer, in delta-seconds (RFC 9110 §10.2.3);
/// [`DEFAULT_RETRY_AFTER`] when absent or not a number of seconds.
pub fn retry_after_of(headers: &axum::http::HeaderMap) -> Duration {
    headers
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(DEFAULT_RETRY_AFTER, Duration::from_secs)
}

/// The answer to a request held back: a 429 `Status` saying it was not
/// sent, with the time left as `Retry-After` (whole seconds, rounded up).
fn held_back(left: Duration) -> Response<axum::body::Body> {
    let secs = left.as_secs() + u64::from(left.subsec_nanos() > 0);
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "reason": "TooManyRequests", "code": 429,
        "message": format!("not sent: the API server asked this client to wait (Retry-After), {} ms left", left.as_millis()),
        "details": {"retryAfterSeconds": secs},
    });
    Response::builder()
        .status(StatusCode::TOO_MANY_REQUESTS)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::RETRY_AFTER, secs)
        .body(axum::body::Body::from(body.to_string()))
        .expect("a valid response")
}

/// See [`Throttle::layer`].
#[derive(Clone, Debug)]
pub struct ThrottleLayer(Throttle);

impl<S> Layer<S> for ThrottleLayer {
    type Service = ThrottleService<S>;

    fn layer(&self, inner: S) -> ThrottleService<S> {
        ThrottleService {
            inner,
            throttle: self.0.clone(),
        }
    }
}

/// A client service behind a [`Throttle`].
#[derive(Clone, Debug)]
pub struct ThrottleService<S> {
    inner: S,
    throttle: Throttle,
}

type Answer<E> = Pin<Box<dyn Future<Output = Result<Response<axum::body::Body>, E>> + Send>>;

impl<S, ReqB, B> Service<Request<ReqB>> for ThrottleService<S>
where
    S: Service<Request<ReqB>, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: axum::body::HttpBody<Data = axum::body::Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<axum::body::Body>;
    type Error = S::Error;
    type Future = Answer<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        if let Some(left) = self.throttle.left() {
            return Box::pin(std::future::ready(Ok(held_back(left))));
        }
        let answer = self.inner.call(req);
        let throttle = self.throttle.clone();
        Box::pin(async move {
            let res = answer.await?;
            if res.status() == StatusCode::TOO_MANY_REQUESTS {
                throttle.told(retry_after_of(res.headers()));
            }
            Ok(res.map(axum::body::Body::new))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tower::ServiceExt;

    use super::*;

    type Answered = std::future::Ready<Result<Response<String>, BoxError>>;

    fn answering(
        code: u16,
        retry_after: Option<&'static str>,
        sent: Arc<AtomicUsize>,
    ) -> tower::util::ServiceFn<impl FnMut(Request<String>) -> Answered> {
        tower::service_fn(move |_req: Request<String>| {
            sent.fetch_add(1, Ordering::SeqCst);
            let mut r = Response::builder().status(code);
            if let Some(v) = retry_after {
                r = r.header(header::RETRY_AFTER, v);
            }
            std::future::ready(Ok::<_, BoxError>(
                r.body("Too many requests, please try again later.".to_owned())
                    .unwrap(),
            ))
        })
    }

    async fn send<S>(svc: &mut S) -> u16
    where
        S: Service<Request<String>, Response = Response<axum::body::Body>>,
        S::Error: std::fmt::Debug,
    {
        let r = svc.ready().await.unwrap();
        r.call(Request::new(String::new()))
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    #[tokio::test(start_paused = true)]
    async fn a_429_holds_every_request_back_for_its_retry_after() {
        let sent = Arc::new(AtomicUsize::new(0));
        let throttle = Throttle::new(Duration::from_secs(5));
        let mut svc = throttle
            .layer()
            .layer(answering(429, Some("2"), sent.clone()));
        assert_eq!(send(&mut svc).await, 429);
        assert_eq!(sent.load(Ordering::SeqCst), 1);
        let left = throttle.left().unwrap();
        assert!(left > Duration::from_millis(1900) && left <= Duration::from_secs(2));
        // Held back: answered 429 here, nothing sent.
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert_eq!(send(&mut svc).await, 429);
        assert_eq!(
            sent.load(Ordering::SeqCst),
            1,
            "nothing sent while told to wait"
        );
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(throttle.left().is_none());
        send(&mut svc).await;
        assert_eq!(sent.load(Ordering::SeqCst), 2, "sent once the wait is over");
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_defaults_to_a_second_and_is_capped() {
        let sent = Arc::new(AtomicUsize::new(0));
        let throttle = Throttle::new(Duration::from_secs(5));
        let mut svc = throttle.layer().layer(answering(429, None, sent.clone()));
        send(&mut svc).await;
        assert_eq!(throttle.left(), Some(DEFAULT_RETRY_AFTER));
        let throttle = Throttle::new(Duration::from_secs(5));
        let mut svc = throttle
            .layer()
            .layer(answering(429, Some("32"), sent.clone()));
        send(&mut svc).await;
        assert_eq!(throttle.left(), Some(Duration::from_secs(5)), "capped");
        let throttle = Throttle::new(Duration::from_secs(5));
        let mut svc = throttle.layer().layer(answering(200, Some("9"), sent));
        send(&mut svc).await;
        assert_eq!(throttle.left(), None, "only a 429 throttles");
    }
}
