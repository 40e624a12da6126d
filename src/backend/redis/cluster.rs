//! **Redis Cluster** (`--redis-cluster`): the cluster client over the seed
//! URLs of `--redis-url`, and the pub/sub connection (to a seed node:
//! `PUBLISH` reaches every node of a cluster).
//!
//! The client ([`redis::cluster::ClusterClient`]) learns the slot map from
//! any seed that answers, routes each request to its slot's primary, follows
//! `MOVED` and `ASK`, and reads the map again after a redirection; the
//! caller ([`super::server`]) drops the connection after a timeout or a
//! refused connection, so the next request starts from the seeds again and
//! finds a promoted replica.
//!
//! What this does not give: Redis Cluster is not consensus. Replication is
//! asynchronous, so a replica promoted after its primary died or froze may
//! lack the last writes of the slot (a grant, a renewal, a counter raise).
//! The campaign script's promotion hold-off (a new `master_replid` on the
//! slot's primary keeps every candidate out for one lease duration + 1 s)
//! and fencing tokens that never go back keep the terms apart; not the
//! cluster.

use redis::Client;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use tokio::time::{Duration, timeout};

use super::sentinel::open_client;
use super::{RedisOptions, redact};

/// How often the cluster client retries one request itself (a `MOVED`
/// slot map refresh, `TRYAGAIN`); the request's deadline bounds it anyway.
const RETRIES: u32 = 3;

/// A cluster client over the seed `urls`, and a plain client per seed for
/// pub/sub (labelled by its redacted URL).
///
/// # Errors
/// A message naming the (redacted) URL that cannot be used.
pub fn open(
    urls: &[String],
    options: &RedisOptions,
) -> std::result::Result<(ClusterClient, Vec<(String, Client)>), String> {
    let mut infos = Vec::new();
    let mut seeds = Vec::new();
    for url in urls {
        let label = redact(url);
        let mut info: redis::ConnectionInfo = url
            .parse()
            .map_err(|e| format!("{label} is not a Redis URL: {e}"))?;
        if info.redis.password.is_none() {
            info.redis.password = options.password.clone();
        }
        seeds.push((
            label.clone(),
            open_client(info.clone(), options.ca_pem.as_deref(), &label)?,
        ));
        infos.push(info);
    }
    let mut builder = ClusterClientBuilder::new(infos)
        .connection_timeout(options.per_server_timeout)
        .response_timeout(options.per_server_timeout)
        .retries(RETRIES)
        .min_retry_wait(10)
        .max_retry_wait(100);
    if let Some(ca) = &options.ca_pem {
        builder = builder.certs(redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(ca.clone()),
        });
    }
    let client = builder
        .build()
        .map_err(|e| format!("--redis-cluster over {}: {e}", label(urls)))?;
    Ok((client, seeds))
}

/// `cluster@<first seed>`, for logs and errors.
pub fn label(urls: &[String]) -> String {
    format!(
        "cluster@{}",
        urls.first().map(|u| redact(u)).unwrap_or_default()
    )
}

/// A pub/sub connection to the first seed that accepts one within `limit`
/// each, starting after the one that served last (`start`); returns it
/// with its index.
///
/// # Errors
/// The last seed's error, or `None` when every seed timed out.
pub async fn pubsub(
    seeds: &[(String, Client)],
    start: usize,
    limit: Duration,
) -> Result<(usize, redis::aio::PubSub), Option<redis::RedisError>> {
    let mut last = None;
    for k in 0..seeds.len() {
        let i = (start + k) % seeds.len();
        match timeout(limit, seeds[i].1.get_async_pubsub()).await {
            Ok(Ok(ps)) => return Ok((i, ps)),
            Ok(Err(e)) => last = Some(e),
            Err(_) => {}
        }
    }
    Err(last)
}

/// Whether an error of this kind is the cluster's own transient state (a
/// slot without a live primary, a redirection the client gave up
/// following): the connection is dropped and the next request starts from
/// a fresh slot map, as after a refused connection.
pub fn is_transient(kind: redis::ErrorKind) -> bool {
    matches!(
        kind,
        redis::ErrorKind::ClusterDown
            | redis::ErrorKind::TryAgain
            | redis::ErrorKind::MasterDown
            | redis::ErrorKind::ClusterConnectionNotFound
            | redis::ErrorKind::Moved
            | redis::ErrorKind::Ask
    )
}
