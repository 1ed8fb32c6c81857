//! One module per Kafka API, named after Kafka's schema. Each exposes `handle` (or, for
//! Produce, `start`); `admin` holds the controller-side topic changes several APIs share.

pub mod admin;
pub mod alter_configs;
pub mod api_versions;
pub mod create_partitions;
pub mod create_topics;
pub mod delete_records;
pub mod delete_topics;
pub mod describe_cluster;
pub mod describe_configs;
pub mod fetch;
pub mod incremental_alter_configs;
pub mod init_producer_id;
pub mod list_offsets;
pub mod metadata;
pub mod offset_for_leader_epoch;
pub mod produce;
