//! One deadline per request: a coordination request answers
//! within its `wait` plus one call deadline, however many backend calls it
//! makes. The coordination service (`coord::Service`) opens a budget for each request
//! ([`within`]); a coordinator cuts the limit of each of its calls to what
//! is left of it ([`limit`]). Work a coordinator runs off the answer path
//! (in a task of its own, such as a lease revoke after a failure) is outside
//! the request's budget and keeps its own full deadline; so is everything
//! the Elector does (it never runs inside a budget). It lives at the crate
//! root because the backends' own call wrappers (Redis) read it too.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

tokio::task_local! {
    /// When the current request's budget ends.
    static UNTIL: Instant;
}

/// The shortest limit handed to a call once the budget is spent: the call
/// then fails at once with a timeout that names it.
const SPENT: Duration = Duration::from_millis(1);

/// Run `request` with a budget that ends at `until`.
pub async fn within<F: Future>(until: Instant, request: F) -> F::Output {
    UNTIL.scope(until, request).await
}

/// The limit of one backend call whose own deadline is `per_call`: cut to
/// what is left of the current request's budget (at least 1 ms), or
/// `per_call` outside a request.
pub fn limit(per_call: Duration) -> Duration {
    match UNTIL.try_with(|until| until.saturating_duration_since(Instant::now())) {
        Ok(left) => per_call.min(left).max(SPENT),
        Err(_) => per_call,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn calls_share_the_request_budget_and_nothing_outside_it_is_cut() {
        let per_call = Duration::from_secs(2);
        assert_eq!(limit(per_call), per_call, "outside a request");
        let until = Instant::now() + Duration::from_secs(3);
        within(until, async {
            assert_eq!(limit(per_call), per_call);
            tokio::time::advance(Duration::from_secs(2)).await;
            assert_eq!(limit(per_call), Duration::from_secs(1));
            tokio::time::advance(Duration::from_secs(5)).await;
            assert_eq!(limit(per_call), SPENT);
            // A task of its own is outside the budget.
            let off_path = tokio::spawn(async move { limit(per_call) });
            assert_eq!(off_path.await.unwrap(), per_call);
        })
        .await;
    }
}
