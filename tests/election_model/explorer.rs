//! A small exhaustive explorer: breadth-first search over every state a
//! [`Model`] can reach, checking its invariant in each one.
//!
//! Deterministic by construction: states are numbered in the order they are
//! found, actions are tried in the order the model lists them, and the hash
//! map is used only to look states up, never iterated. Breadth-first order
//! makes the first counterexample found a shortest one (fewest actions), and
//! the parent links give it back as a trace.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::hash::{BuildHasherDefault, Hash, Hasher};

/// What the explorer needs from a model.
pub trait Model {
    /// One global state: backend, candidates, fault budgets, monitors.
    type State: Clone;
    /// What identifies a state: two states with equal keys behave alike
    /// (the key leaves out what no rule reads, such as a token kept only to
    /// be printed), and a compact key hashes fast in a debug build.
    type Key: Eq + Hash;
    /// One step: a tick of real time, a candidate's action, a fault.
    type Action: Clone + fmt::Display;

    /// The key of `s`.
    fn key(&self, s: &Self::State) -> Self::Key;
    /// The initial states (one per choice of clock rates, say).
    fn init(&self) -> Vec<Self::State>;
    /// The actions enabled in `s`, in a fixed order.
    fn actions(&self, s: &Self::State, out: &mut Vec<Self::Action>);
    /// The state after `a`, or a violation found while taking it (a claim
    /// with a fencing token that did not grow), with the state reached.
    fn step(&self, s: &Self::State, a: &Self::Action)
    -> Result<Self::State, (Self::State, String)>;
    /// The invariant: `Some(reason)` when `s` breaks it.
    fn check(&self, s: &Self::State) -> Option<String>;
    /// One line describing `s` for traces.
    fn describe(&self, s: &Self::State) -> String;
    /// Whether `a` lets real time pass (traces number the ticks).
    fn is_tick(&self, a: &Self::Action) -> bool;
    /// `step` without canonical renumbering, to print traces with the
    /// numbers a reader expects (versions and tokens that only grow).
    fn step_raw(&self, s: &Self::State, a: &Self::Action) -> Self::State {
        match self.step(s, a) {
            Ok(t) | Err((t, _)) => t,
        }
    }
}

/// A path from an initial state to the state that broke the invariant.
pub struct Trace {
    /// Why the last state is bad.
    pub reason: String,
    /// The initial state, described.
    pub start: String,
    /// Each action taken, with the real time (ticks) at which it was taken
    /// and the state it led to.
    pub steps: Vec<(u32, String, String)>,
}

impl Trace {
    /// Whether an action of the trace mentions `needle`.
    pub fn has_action(&self, needle: &str) -> bool {
        self.steps
            .iter()
            .any(|(_, action, _)| action.contains(needle))
    }
}

impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "  start        {}", self.start)?;
        for (t, action, state) in &self.steps {
            writeln!(f, "  t={t:<3} {action}")?;
            writeln!(f, "               -> {state}")?;
        }
        write!(f, "  VIOLATION: {}", self.reason)
    }
}

/// The result of one exploration.
pub struct Outcome {
    /// Distinct states reached (after canonicalization).
    pub states: usize,
    /// Transitions taken (edges, including those to known states).
    pub transitions: u64,
    /// The first (shortest) counterexample, if any.
    pub counterexample: Option<Trace>,
    /// Whether the exploration stopped at the state limit before the end.
    pub truncated: bool,
}

/// FxHash (rustc's hasher): fast in debug builds, and deterministic.
#[derive(Default)]
pub struct Fx(u64);

impl Hasher for Fx {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
}

/// Explores every state reachable from `model.init()` (at most `limit`
/// states), stopping at the first violation.
pub fn explore<M: Model>(model: &M, limit: usize) -> Outcome {
    let mut index: HashMap<M::Key, u32, BuildHasherDefault<Fx>> = HashMap::default();
    // Per state found: its parent and the action that led to it (initial
    // states: `u32::MAX` and the initial state's number in `inits`).
    let mut parents: Vec<(u32, Option<M::Action>)> = Vec::new();
    let mut queue: VecDeque<(M::State, u32)> = VecDeque::new();
    let inits = model.init();
    for s in &inits {
        if index.insert(model.key(s), parents.len() as u32).is_none() {
            queue.push_back((s.clone(), parents.len() as u32));
            parents.push((u32::MAX, None));
        }
    }
    let mut transitions = 0u64;
    let mut actions = Vec::new();
    let found =
        |parents: &[(u32, Option<M::Action>)], at: u32, reason: String, transitions| Outcome {
            states: parents.len(),
            transitions,
            counterexample: Some(trace(model, &inits, parents, at, reason)),
            truncated: false,
        };
    while let Some((state, id)) = queue.pop_front() {
        if let Some(reason) = model.check(&state) {
            return found(&parents, id, reason, transitions);
        }
        actions.clear();
        model.actions(&state, &mut actions);
        for a in &actions {
            transitions += 1;
            match model.step(&state, a) {
                Err((after, reason)) => {
                    let reason = match model.check(&after) {
                        Some(also) => format!("{also}; {reason}"),
                        None => reason,
                    };
                    parents.push((id, Some(a.clone())));
                    return found(&parents, parents.len() as u32 - 1, reason, transitions);
                }
                Ok(after) => {
                    let key = model.key(&after);
                    if index.contains_key(&key) {
                        continue;
                    }
                    if parents.len() >= limit {
                        return Outcome {
                            states: parents.len(),
                            transitions,
                            counterexample: None,
                            truncated: true,
                        };
                    }
                    index.insert(key, parents.len() as u32);
                    queue.push_back((after, parents.len() as u32));
                    parents.push((id, Some(a.clone())));
                }
            }
        }
    }
    Outcome {
        states: parents.len(),
        transitions,
        counterexample: None,
        truncated: false,
    }
}

/// The path to state `bad`, replayed from its initial state with
/// [`Model::step_raw`] so that it shows the numbers a reader expects.
fn trace<M: Model>(
    model: &M,
    inits: &[M::State],
    parents: &[(u32, Option<M::Action>)],
    bad: u32,
    reason: String,
) -> Trace {
    let mut path = Vec::new();
    let mut at = bad as usize;
    while parents[at].0 != u32::MAX {
        path.push(
            parents[at]
                .1
                .clone()
                .expect("a non-initial state has an action"),
        );
        at = parents[at].0 as usize;
    }
    path.reverse();
    // Initial states are numbered first, in the order of `inits` (skipping
    // duplicates): find which one `at` is.
    let mut seen: Vec<M::Key> = Vec::new();
    let mut start = None;
    for s in inits {
        let k = model.key(s);
        if seen.contains(&k) {
            continue;
        }
        if seen.len() == at {
            start = Some(s.clone());
            break;
        }
        seen.push(k);
    }
    let mut state = start.expect("the path starts at an initial state");
    let start = model.describe(&state);
    let mut t = 0u32;
    let mut steps = Vec::new();
    let mut step_error = None;
    for action in path {
        if model.is_tick(&action) {
            t += 1;
        }
        let after = model.step_raw(&state, &action);
        step_error = model.step(&state, &action).err().map(|(_, r)| r);
        state = after;
        steps.push((t, action.to_string(), model.describe(&state)));
    }
    // The reason again, from the raw states (canonical ones are renumbered).
    let reason = match (model.check(&state), step_error) {
        (Some(c), Some(e)) => format!("{c}; {e}"),
        (Some(c), None) => c,
        (None, Some(e)) => e,
        (None, None) => reason,
    };
    Trace {
        reason,
        start,
        steps,
    }
}

/// Plays `script` from `start`, checking that each action is one the model
/// allows in the state reached (so the script is a behaviour of the model),
/// and returns it as a trace whose reason is the violation at the end, or
/// `None` when the invariant still holds there.
pub fn play<M: Model>(model: &M, start: &M::State, script: &[M::Action]) -> (Trace, bool)
where
    M::Action: PartialEq + fmt::Debug,
{
    let mut state = start.clone();
    let mut steps = Vec::new();
    let mut t = 0u32;
    let mut step_error = None;
    let mut enabled = Vec::new();
    for action in script {
        enabled.clear();
        model.actions(&state, &mut enabled);
        assert!(
            enabled.contains(action),
            "scripted action {action:?} is not enabled in: {}",
            model.describe(&state)
        );
        if model.is_tick(action) {
            t += 1;
        }
        step_error = model.step(&state, action).err().map(|(_, r)| r);
        state = model.step_raw(&state, action);
        steps.push((t, action.to_string(), model.describe(&state)));
    }
    let reason = match (model.check(&state), step_error) {
        (Some(c), Some(e)) => Some(format!("{c}; {e}")),
        (c, e) => c.or(e),
    };
    let violated = reason.is_some();
    let reason = reason.unwrap_or_else(|| "none: the invariant holds".into());
    (
        Trace {
            reason,
            start: model.describe(start),
            steps,
        },
        violated,
    )
}

/// `M` with its invariant replaced by "`goal` does not hold": exploring it
/// finds a shortest trace to a state where `goal` holds (a liveness twin's
/// witness that the model can get there at all), or holds when no state
/// reachable within the bounds does.
pub struct Reach<M, F>(pub M, pub F);

impl<M: Model, F: Fn(&M::State) -> bool> Model for Reach<M, F> {
    type State = M::State;
    type Key = M::Key;
    type Action = M::Action;

    fn key(&self, s: &M::State) -> M::Key {
        self.0.key(s)
    }
    fn init(&self) -> Vec<M::State> {
        self.0.init()
    }
    fn actions(&self, s: &M::State, out: &mut Vec<M::Action>) {
        self.0.actions(s, out)
    }
    fn step(&self, s: &M::State, a: &M::Action) -> Result<M::State, (M::State, String)> {
        self.0.step(s, a)
    }
    fn check(&self, s: &M::State) -> Option<String> {
        (self.1)(s).then(|| "the goal state is reached".to_string())
    }
    fn describe(&self, s: &M::State) -> String {
        self.0.describe(s)
    }
    fn is_tick(&self, a: &M::Action) -> bool {
        self.0.is_tick(a)
    }
    fn step_raw(&self, s: &M::State, a: &M::Action) -> M::State {
        self.0.step_raw(s, a)
    }
}
