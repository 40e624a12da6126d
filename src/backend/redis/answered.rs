//! **Redlock's "enough servers answered" rule**, written once beside the
//! renew and release verdicts ([`super::verdict`]): a command sent to
//! every server of a [`Group`] (a read of the holders, the controls or the
//! registry; a write of a control; a coordination scan or acquisition)
//! counts only when at least a quorum q = N/2 + 1 of the N servers answered
//! it. Fewer answers prove nothing about the key: the servers that did not
//! answer may hold anything, so the caller gets an error, never a partial
//! answer taken for the whole.
//!
//! The error is the first server's own (a refused password, a timeout,
//! a reset), or, when every server answered but too few took the command,
//! [`BackendError::Unreachable`] naming the count ("only 1 of 3 servers
//! answered; a quorum is 2").

use super::BACKEND;
use super::group::Group;
use crate::backend::{BackendError, Result};

/// The answers of one command sent to every server: those that came back,
/// and the first failure.
#[derive(Debug)]
pub struct Answers<T> {
    /// The servers' answers that came back, in the servers' order.
    pub ok: Vec<T>,
    /// The first server error, if any server failed.
    pub error: Option<BackendError>,
}

impl<T> Answers<T> {
    /// Split the servers' results into answers and the first error.
    pub fn of(results: impl IntoIterator<Item = Result<T>>) -> Answers<T> {
        let mut ok = Vec::new();
        let mut error = None;
        for r in results {
            match r {
                Ok(v) => ok.push(v),
                Err(e) => {
                    error.get_or_insert(e);
                }
            }
        }
        Answers { ok, error }
    }

    /// The answers when a quorum of `group` answered (`what` names the act
    /// for the error, e.g. "answered"); else the error of
    /// [`Group::enough`].
    ///
    /// # Errors
    /// As [`Group::enough`].
    pub fn on_quorum(self, group: &Group, what: &str) -> Result<Vec<T>> {
        group.enough(self.ok.len(), self.error, what)?;
        Ok(self.ok)
    }
}

impl Group {
    /// The rule: `Ok` when `answered` servers are at least a quorum; else
    /// `error` (the first server error), or `Unreachable` naming the count
    /// and `what` the servers did ("answered", "took the change").
    ///
    /// # Errors
    /// The first server error, else [`BackendError::Unreachable`].
    pub fn enough(&self, answered: usize, error: Option<BackendError>, what: &str) -> Result<()> {
        if answered >= self.quorum() {
            return Ok(());
        }
        Err(self.no_quorum(error, answered, what))
    }

    /// Whether `answered` servers are fewer than a quorum (for a caller
    /// that, short of one, still reads what the answers say when no server
    /// failed: a refusal is an answer too).
    pub fn short_of_quorum(&self, answered: usize) -> bool {
        answered < self.quorum()
    }

    /// An error for too few answers: the first server error, else
    /// `Unreachable` naming the count.
    pub fn no_quorum(&self, error: Option<BackendError>, ok: usize, what: &str) -> BackendError {
        error.unwrap_or_else(|| BackendError::Unreachable {
            backend: BACKEND,
            endpoints: self.endpoints(),
            source: format!(
                "only {ok} of {} servers {what}; a quorum is {}",
                self.servers().len(),
                self.quorum()
            )
            .into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::redis::verdict::group_of;

    fn failed() -> BackendError {
        BackendError::Unreachable {
            backend: BACKEND,
            endpoints: "s1".into(),
            source: "connection refused".into(),
        }
    }

    /// Safety: fewer answers than a quorum are never taken for an answer
    /// (the first server error, else the count, is returned); liveness
    /// twin: a quorum of answers is enough, whatever the others did.
    #[test]
    fn a_quorum_of_answers_is_enough_and_fewer_are_an_error() {
        let three = group_of(3);
        let two_of_three = Answers::of([Ok(1), Err(failed()), Ok(2)]);
        assert_eq!(two_of_three.on_quorum(&three, "answered").unwrap(), [1, 2]);
        let one_of_three = Answers::of([Err(failed()), Ok(1), Err(failed())]);
        let e = one_of_three.on_quorum(&three, "answered").unwrap_err();
        assert!(e.report().contains("connection refused"), "{}", e.report());
        let counted = three.enough(1, None, "took the change").unwrap_err();
        assert!(
            counted
                .report()
                .contains("only 1 of 3 servers took the change; a quorum is 2"),
            "{}",
            counted.report()
        );
        assert!(group_of(1).enough(1, None, "answered").is_ok());
        assert!(group_of(5).short_of_quorum(2));
        assert!(!group_of(5).short_of_quorum(3));
    }
}
