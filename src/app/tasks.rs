//! The running app's one table of tasks and its one shutdown budget.
//!
//! Every task the app spawns is a [`Task`] row: its name (the log field
//! `task`), whether its end before shutdown stops the app, how it is told to
//! stop, and its share of the shutdown budget. At shutdown the rows are
//! awaited in table order (resign, labeler, run-mode child, notifications,
//! health, HTTP drain), each within its own limit and within what is left of
//! the whole budget; a row that overruns is logged with its own message and
//! aborted. Every task's end is logged with its reason; a panic is logged as
//! an error, never swallowed.

use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use tokio::task::{JoinError, JoinHandle};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span, debug, error, warn};

/// What a task returns: the process exit code it asks for (only the run-mode
/// supervisor with `--on-child-exit exit` asks for one), else `None`.
pub type TaskOutput = Option<i32>;

/// How a task is told to stop at shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// It watches the app's shutdown token, cancelled when shutdown begins.
    Shutdown,
    /// It is aborted when its turn comes (it has nothing to finish).
    Abort,
    /// It watches the HTTP stop token, cancelled when its turn comes, so
    /// the listeners keep answering while the Elector resigns.
    Http,
}

/// One row of the task table.
pub struct Task {
    /// The task's name in logs (`task = ...`).
    pub name: &'static str,
    /// The error logged when the task ends before shutdown was requested;
    /// `None` for tasks that may end on their own (the app goes on).
    pub unexpected: Option<&'static str>,
    /// How the task is told to stop.
    pub stop: Stop,
    /// Its share of the shutdown budget.
    pub limit: Duration,
    /// The warning logged when it overruns `limit` (then it is aborted);
    /// `None` to abort it silently.
    pub late: Option<&'static str>,
    /// The error logged when it panics; `None` for the generic "task ended".
    pub failed: Option<&'static str>,
    handle: JoinHandle<TaskOutput>,
    ended: Option<Result<TaskOutput, JoinError>>,
}

impl Task {
    /// Spawn `fut` in `span` as the row `name`, stopped by `stop` within
    /// `limit` at shutdown.
    pub fn spawn<F>(name: &'static str, stop: Stop, limit: Duration, span: Span, fut: F) -> Self
    where
        F: Future<Output = TaskOutput> + Send + 'static,
    {
        Task {
            name,
            unexpected: None,
            stop,
            limit,
            late: None,
            failed: None,
            handle: tokio::spawn(fut.instrument(span)),
            ended: None,
        }
    }

    /// The app stops, logging `message` as an error, if this task ends
    /// before shutdown was requested.
    #[must_use]
    pub fn critical(mut self, message: &'static str) -> Self {
        self.unexpected = Some(message);
        self
    }

    /// The warning to log if the task overruns its limit at shutdown.
    #[must_use]
    pub fn late(mut self, message: &'static str) -> Self {
        self.late = Some(message);
        self
    }

    /// The error to log if the task panics.
    #[must_use]
    pub fn failed(mut self, message: &'static str) -> Self {
        self.failed = Some(message);
        self
    }

    /// Log how the task ended, with its reason; a panic is an error.
    fn log_end(&self) {
        let name = self.name;
        match &self.ended {
            None => {}
            Some(Ok(code)) => {
                debug!(task = name, reason = "finished", exit_code = ?code, "task ended")
            }
            Some(Err(e)) if e.is_panic() => {
                let message = self.failed.unwrap_or("task ended");
                error!(task = name, reason = "panicked", error = %e, "{message}")
            }
            Some(Err(e)) => debug!(task = name, reason = "cancelled", error = %e, "task ended"),
        }
    }
}

/// Every task of the running app, in shutdown order.
#[derive(Default)]
pub struct Tasks {
    rows: Vec<Task>,
}

impl Tasks {
    /// Add a row (rows are stopped in the order they were added).
    pub fn push(&mut self, task: Task) {
        self.rows.push(task);
    }

    /// Add a row if there is one.
    pub fn push_opt(&mut self, task: Option<Task>) {
        self.rows.extend(task);
    }

    /// The whole shutdown budget: the sum of the rows' limits.
    pub fn budget(&self) -> Duration {
        self.rows.iter().map(|t| t.limit).sum()
    }

    /// Wait for the next task to end; returns its index. Pending forever
    /// when every task has ended.
    async fn next_end(&mut self) -> usize {
        std::future::poll_fn(|cx| {
            for (i, t) in self.rows.iter_mut().enumerate() {
                if t.ended.is_none()
                    && let Poll::Ready(r) = std::pin::Pin::new(&mut t.handle).poll(cx)
                {
                    t.ended = Some(r);
                    return Poll::Ready(i);
                }
            }
            Poll::Pending
        })
        .await
    }

    /// Run until `shutdown` is cancelled or a critical task ends on its own
    /// (then log its error and cancel `shutdown`). Tasks that end on their
    /// own are logged as they end. A task that ends *because* shutdown was
    /// requested is not unexpected: the token is checked first (`biased`),
    /// and again when a task wins the race, since the Elector may finish in
    /// the same poll as the signal task cancels the token.
    pub async fn until_shutdown(&mut self, shutdown: &CancellationToken) {
        loop {
            let i = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                i = self.next_end() => i,
            };
            let t = &self.rows[i];
            t.log_end();
            let ended = t.ended.as_ref().expect("just ended");
            if let Some(message) = t.unexpected {
                if shutdown.is_cancelled() && ended.is_ok() {
                    return;
                }
                error!(task = t.name, result = ?ended, "{message}");
                shutdown.cancel();
                return;
            }
        }
    }

    /// Stop every task in table order within the shutdown budget, `http_stop`
    /// cancelled when the first [`Stop::Http`] row comes. Returns the exit code
    /// a task asked for.
    pub async fn stop(self, http_stop: &CancellationToken) -> TaskOutput {
        let deadline = Instant::now() + self.budget();
        let mut exit_code = None;
        for mut t in self.rows {
            match t.stop {
                Stop::Abort => t.handle.abort(),
                Stop::Http => http_stop.cancel(),
                Stop::Shutdown => {}
            }
            if t.ended.is_none() {
                let limit = t
                    .limit
                    .min(deadline.saturating_duration_since(Instant::now()));
                match tokio::time::timeout(limit, &mut t.handle).await {
                    Ok(r) => {
                        t.ended = Some(r);
                        t.log_end();
                    }
                    Err(_) => {
                        if let Some(message) = t.late {
                            warn!(task = t.name, "{message}");
                        }
                        debug!(task = t.name, reason = "out of time", "task ended");
                        t.handle.abort();
                    }
                }
            }
            if let Some(Ok(Some(code))) = t.ended {
                exit_code = Some(code);
            }
        }
        exit_code
    }
}

#[cfg(test)]
#[path = "tasks_tests.rs"]
mod tests;
