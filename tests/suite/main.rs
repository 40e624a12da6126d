//! The integration suite: the sidecar as real processes against real etcd
//! and Redis servers and the in-process Kubernetes API stand-in, one test
//! binary so the kit (`tests/support/`) and the crate are compiled and
//! linked once. Tests that start servers take their ports from the kit
//! (port 0, or ports below the kernel's ephemeral range) and their own
//! temporary directories, so any of them may run side by side.
//!
//! Run one area with a filter on its module: `cargo test --test suite
//! kubernetes::` (the first segment is the module below). The election
//! model (`tests/election_model/`, no servers) is a binary of its own.

#[path = "../support/mod.rs"]
mod support;

mod alive;
mod cli_docs;
mod closed_output;
mod cluster;
mod cooperate;
mod coord;
mod docs_refs;
mod etcd;
mod etcd_handover;
mod etcd_handover_ttl;
mod etcd_ops;
mod example_operator;
mod failsafe;
mod failsafe_cut;
mod failsafe_lease;
mod failsafe_redis;
mod failsafe_sign;
mod fault;
mod kubernetes;
mod kubernetes_bridge;
mod kubernetes_fault;
mod kubernetes_ops;
mod kubernetes_slice;
mod lease_coord;
mod model;
mod ops;
mod ops_controls;
mod ops_matrix;
mod ops_priority;
mod partition;
mod partition_failsafe;
mod partition_kube;
mod partition_scenarios;
mod partition_sentinel;
mod periods;
mod redis;
mod redis_ops;
mod redlock_coord;
mod run_start;
mod rwlock;
mod sentinel;
mod shards;
mod shards_redis;
mod stand_in;
mod strict_input;
mod successor;
