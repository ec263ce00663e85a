//! Commit events on a real 3-node Kafka cluster (KRaft, every topic
//! replicated three times, `min.insync.replicas=2`): the partition leader
//! killed with SIGKILL while events flow, and a rolling restart of all
//! three nodes. Each test reads the topic back with a read_committed
//! consumer and checks per file what `kafka.rs` checks: every range once,
//! in order, every rename told, a seal whose digest matches the
//! destination, no event twice.

mod common;

use std::sync::Mutex;

use common::kafka::{
    KafkaCluster, TOPIC, events_pipeline, finish_and_check, wait_more_acknowledged,
};
use common::{scratch, simulate_in_background, workload};

/// Three JVMs per cluster on a 2-core machine: one cluster at a time.
static ONE_CLUSTER: Mutex<()> = Mutex::new(());

#[test]
fn killing_the_partition_leader_loses_nothing() {
    let _one = ONE_CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    let dir = scratch("kafka-cluster-leader");
    let mut cluster = KafkaCluster::start(&dir.join("kafka"), 4);
    let pipeline = events_pipeline("kafka-cluster-leader-run", &cluster.bootstrap());
    let sim = simulate_in_background(
        &pipeline.dir,
        &pipeline.source,
        &workload("r0001", "3", "1MiB", "600s"),
    );
    wait_more_acknowledged(&pipeline, "transactions acknowledged");
    let leader = cluster.leader_of(TOPIC, 0);
    cluster.nodes[leader].kill9();
    println!("node {} (leader of {TOPIC}/0) killed", leader + 1);
    wait_more_acknowledged(&pipeline, "transactions acknowledged by two nodes");
    cluster.nodes[leader].start_again();
    finish_and_check(
        &pipeline,
        sim,
        &cluster.bootstrap(),
        "with the partition leader killed",
    );
}

#[test]
fn a_rolling_restart_of_the_cluster_loses_nothing() {
    let _one = ONE_CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    let dir = scratch("kafka-cluster-rolling");
    let mut cluster = KafkaCluster::start(&dir.join("kafka"), 4);
    let pipeline = events_pipeline("kafka-cluster-rolling-run", &cluster.bootstrap());
    let sim = simulate_in_background(
        &pipeline.dir,
        &pipeline.source,
        &workload("r0001", "3", "1MiB", "600s"),
    );
    for node in 0..cluster.nodes.len() {
        wait_more_acknowledged(&pipeline, "transactions acknowledged before a restart");
        cluster.wait_fully_replicated();
        cluster.nodes[node].restart();
        println!("node {} restarted", node + 1);
    }
    finish_and_check(
        &pipeline,
        sim,
        &cluster.bootstrap(),
        "across a rolling restart",
    );
}
