//! Operational errors of the broker and the one function that maps them to Kafka error codes.

use ferrolog_io::LogError;
use kafka_protocol::ResponseError;

/// An operational error: the request (or one partition of it) fails, the broker goes on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BrokerError {
    #[error("This server does not host this topic-partition.")]
    UnknownTopicOrPartition,
    #[error("This server does not host this topic ID.")]
    UnknownTopicId,
    #[error("This server is not the leader for that topic-partition.")]
    NotLeaderOrFollower,
    #[error("There is no leader for this topic-partition as we are in the middle of a leadership election.")]
    LeaderNotAvailable,
    #[error("This is not the correct controller for this cluster.")]
    NotController,
    #[error("The leader epoch in the request is newer than the epoch on the broker.")]
    UnknownLeaderEpoch,
    #[error("The leader epoch in the request is older than the epoch on the broker.")]
    FencedLeaderEpoch,
    #[error("{0}")]
    RequestTimedOut(String),
    #[error("{0}")]
    InvalidTopic(String),
    #[error("Topic '{0}' already exists.")]
    TopicAlreadyExists(String),
    #[error("{0}")]
    InvalidPartitions(String),
    #[error("{0}")]
    InvalidReplicationFactor(String),
    #[error("{0}")]
    InvalidConfig(String),
    #[error("{0}")]
    InvalidRequest(String),
    #[error("Topic deletion is disabled.")]
    TopicDeletionDisabled,
    #[error("{0}")]
    CorruptMessage(String),
    #[error("{0}")]
    InvalidRecord(String),
    #[error("{0}")]
    MessageTooLarge(String),
    /// Records refused one by one (KIP-467): the code is INVALID_TIMESTAMP or INVALID_RECORD
    /// and the response lists each refused record's index and reason.
    #[error("{message}")]
    RecordErrors {
        timestamp: bool,
        message: String,
        records: Vec<(i32, String)>,
    },
    #[error("Messages are rejected since there are fewer in-sync replicas than required.")]
    NotEnoughReplicas,
    #[error("The transactional id is not authorized for this operation.")]
    TransactionalIdAuthorizationFailed,
    #[error("The producer attempted a transactional operation in an invalid state.")]
    InvalidTxnState,
    #[error("Indicates that the transaction coordinator sending a WriteTxnMarker is no longer the current coordinator for a given producer.")]
    TransactionCoordinatorFenced,
    #[error("The producer attempted to update a transaction while another concurrent operation on the same transaction was ongoing.")]
    ConcurrentTransactions,
    #[error("The producer attempted to use a producer id which is not currently assigned to its transactional id.")]
    InvalidProducerIdMapping,
    #[error("The transaction timeout is larger than the maximum value allowed by the broker (as configured by transaction.max.timeout.ms).")]
    InvalidTransactionTimeout,
    #[error(
        "There is a newer producer with the same transactionalId which fences the current one."
    )]
    ProducerFenced,
    #[error("The broker did not attempt to execute this operation.")]
    OperationNotAttempted,
    #[error("The transactionalId could not be found.")]
    TransactionalIdNotFound,
    #[error("The broker received an out of order sequence number.")]
    OutOfOrderSequence,
    #[error("Producer attempted to produce with an old epoch.")]
    InvalidProducerEpoch,
    #[error("Produce request specified an invalid value for required acks.")]
    InvalidRequiredAcks,
    #[error("The requested offset is not within the range of offsets maintained by the server.")]
    OffsetOutOfRange,
    #[error("{0}")]
    Storage(String),
    #[error("The version of API is not supported.")]
    UnsupportedVersion,
    #[error("This is not the correct coordinator.")]
    NotCoordinator,
    #[error("{0}")]
    CoordinatorNotAvailable(String),
    #[error("The coordinator is loading and hence can't process requests.")]
    CoordinatorLoadInProgress,
    #[error("The group id is invalid.")]
    InvalidGroupId,
    #[error("The coordinator is not aware of this member.")]
    UnknownMemberId,
    #[error("The session timeout is not within the range allowed by the broker (as configured by group.min.session.timeout.ms and group.max.session.timeout.ms).")]
    InvalidSessionTimeout,
    #[error("The group is rebalancing, so a rejoin is needed.")]
    RebalanceInProgress,
    #[error("Specified group generation id is not valid.")]
    IllegalGeneration,
    #[error("The group member's supported protocols are incompatible with those of existing members or first group member tried to join with empty protocol type or empty protocol list.")]
    InconsistentGroupProtocol,
    #[error("The group member needs to have a valid member id before actually entering a consumer group.")]
    MemberIdRequired,
    #[error("The broker rejected this static consumer since another consumer with the same group.instance.id has registered with a different member.id.")]
    FencedInstanceId,
    #[error("{0}")]
    GroupIdNotFound(String),
    #[error("The group is not empty.")]
    NonEmptyGroup,
    #[error("The consumer group is actively subscribed to the topic.")]
    GroupSubscribedToTopic,
    #[error("The metadata field of the offset request was too large.")]
    OffsetMetadataTooLarge,
    #[error("The group has reached its maximum size.")]
    GroupMaxSizeReached,
    #[error("The member epoch is fenced by the group coordinator. The member must abandon all its partitions and rejoin.")]
    FencedMemberEpoch,
    #[error("The member epoch is stale. The member must retry after receiving its updated member epoch via the ConsumerGroupHeartbeat API.")]
    StaleMemberEpoch,
    #[error("{0}")]
    UnsupportedAssignor(String),
    #[error("{0}")]
    UnreleasedInstanceId(String),
    #[error("The committing offset data size is not valid.")]
    InvalidCommitOffsetSize,
    #[error("{0}")]
    InvalidRegularExpression(String),
    #[error("Leader election not needed for topic partition.")]
    ElectionNotNeeded,
    #[error("{0}")]
    PreferredLeaderNotAvailable(String),
    #[error("{0}")]
    EligibleLeadersNotAvailable(String),
    /// The error the controller leader answered a request this node forwarded to it with.
    #[error("{message}")]
    AtController { code: i16, message: String },
}

impl BrokerError {
    /// The code for a client of an API's `version`, where PRODUCER_FENCED is new in
    /// `producer_fenced_from`: older clients know INVALID_PRODUCER_EPOCH. By code, so an
    /// answer relayed from another node maps too.
    pub fn code_for(&self, version: i16, producer_fenced_from: i16) -> i16 {
        match self.code() {
            c if c == BrokerError::ProducerFenced.code() && version < producer_fenced_from => {
                BrokerError::InvalidProducerEpoch.code()
            }
            c => c,
        }
    }

    pub fn from_log(e: LogError) -> BrokerError {
        match e {
            LogError::OffsetOutOfRange { .. } => BrokerError::OffsetOutOfRange,
            // Only Raft truncates a log: the batch waited on was not committed and a new
            // leader replaced it.
            LogError::Truncated => BrokerError::NotLeaderOrFollower,
            LogError::Io(_)
            | LogError::Corrupt(_)
            | LogError::InvalidBatch(_)
            | LogError::Closed => BrokerError::Storage(e.to_string()),
        }
    }

    /// The error in a controller leader's answer to a forwarded request: NOT_CONTROLLER and
    /// REQUEST_TIMED_OUT as themselves (the caller may ask again), others as they came.
    pub fn from_controller(code: i16, message: String) -> BrokerError {
        if code == ResponseError::NotController.code() {
            BrokerError::NotController
        } else if code == ResponseError::RequestTimedOut.code() {
            BrokerError::RequestTimedOut(message)
        } else {
            BrokerError::AtController { code, message }
        }
    }

    /// The Kafka error code clients see.
    pub fn code(&self) -> i16 {
        kafka_error(self).code()
    }
}

/// The one mapping from internal errors to Kafka's error codes.
pub fn kafka_error(e: &BrokerError) -> ResponseError {
    match e {
        BrokerError::UnknownTopicOrPartition => ResponseError::UnknownTopicOrPartition,
        BrokerError::UnknownTopicId => ResponseError::UnknownTopicId,
        BrokerError::NotLeaderOrFollower => ResponseError::NotLeaderOrFollower,
        BrokerError::LeaderNotAvailable => ResponseError::LeaderNotAvailable,
        BrokerError::NotController => ResponseError::NotController,
        BrokerError::UnknownLeaderEpoch => ResponseError::UnknownLeaderEpoch,
        BrokerError::FencedLeaderEpoch => ResponseError::FencedLeaderEpoch,
        BrokerError::RequestTimedOut(_) => ResponseError::RequestTimedOut,
        BrokerError::InvalidTopic(_) => ResponseError::InvalidTopicException,
        BrokerError::TopicAlreadyExists(_) => ResponseError::TopicAlreadyExists,
        BrokerError::InvalidPartitions(_) => ResponseError::InvalidPartitions,
        BrokerError::InvalidReplicationFactor(_) => ResponseError::InvalidReplicationFactor,
        BrokerError::InvalidConfig(_) => ResponseError::InvalidConfig,
        BrokerError::InvalidRequest(_) => ResponseError::InvalidRequest,
        BrokerError::TopicDeletionDisabled => ResponseError::TopicDeletionDisabled,
        BrokerError::CorruptMessage(_) => ResponseError::CorruptMessage,
        BrokerError::InvalidRecord(_) => ResponseError::InvalidRecord,
        BrokerError::MessageTooLarge(_) => ResponseError::MessageTooLarge,
        BrokerError::RecordErrors {
            timestamp: true, ..
        } => ResponseError::InvalidTimestamp,
        BrokerError::RecordErrors {
            timestamp: false, ..
        } => ResponseError::InvalidRecord,
        BrokerError::TransactionalIdAuthorizationFailed => {
            ResponseError::TransactionalIdAuthorizationFailed
        }
        BrokerError::InvalidTxnState => ResponseError::InvalidTxnState,
        BrokerError::TransactionCoordinatorFenced => ResponseError::TransactionCoordinatorFenced,
        BrokerError::ConcurrentTransactions => ResponseError::ConcurrentTransactions,
        BrokerError::InvalidProducerIdMapping => ResponseError::InvalidProducerIdMapping,
        BrokerError::InvalidTransactionTimeout => ResponseError::InvalidTransactionTimeout,
        BrokerError::ProducerFenced => ResponseError::ProducerFenced,
        BrokerError::OperationNotAttempted => ResponseError::OperationNotAttempted,
        BrokerError::TransactionalIdNotFound => ResponseError::TransactionalIdNotFound,
        BrokerError::NotEnoughReplicas => ResponseError::NotEnoughReplicas,
        BrokerError::OutOfOrderSequence => ResponseError::OutOfOrderSequenceNumber,
        BrokerError::InvalidProducerEpoch => ResponseError::InvalidProducerEpoch,
        BrokerError::InvalidRequiredAcks => ResponseError::InvalidRequiredAcks,
        BrokerError::OffsetOutOfRange => ResponseError::OffsetOutOfRange,
        BrokerError::Storage(_) => ResponseError::KafkaStorageError,
        BrokerError::UnsupportedVersion => ResponseError::UnsupportedVersion,
        BrokerError::NotCoordinator => ResponseError::NotCoordinator,
        BrokerError::CoordinatorNotAvailable(_) => ResponseError::CoordinatorNotAvailable,
        BrokerError::CoordinatorLoadInProgress => ResponseError::CoordinatorLoadInProgress,
        BrokerError::InvalidGroupId => ResponseError::InvalidGroupId,
        BrokerError::UnknownMemberId => ResponseError::UnknownMemberId,
        BrokerError::InvalidSessionTimeout => ResponseError::InvalidSessionTimeout,
        BrokerError::RebalanceInProgress => ResponseError::RebalanceInProgress,
        BrokerError::IllegalGeneration => ResponseError::IllegalGeneration,
        BrokerError::InconsistentGroupProtocol => ResponseError::InconsistentGroupProtocol,
        BrokerError::MemberIdRequired => ResponseError::MemberIdRequired,
        BrokerError::FencedInstanceId => ResponseError::FencedInstanceId,
        BrokerError::GroupIdNotFound(_) => ResponseError::GroupIdNotFound,
        BrokerError::NonEmptyGroup => ResponseError::NonEmptyGroup,
        BrokerError::GroupSubscribedToTopic => ResponseError::GroupSubscribedToTopic,
        BrokerError::OffsetMetadataTooLarge => ResponseError::OffsetMetadataTooLarge,
        BrokerError::GroupMaxSizeReached => ResponseError::GroupMaxSizeReached,
        BrokerError::FencedMemberEpoch => ResponseError::FencedMemberEpoch,
        BrokerError::StaleMemberEpoch => ResponseError::StaleMemberEpoch,
        BrokerError::UnsupportedAssignor(_) => ResponseError::UnsupportedAssignor,
        BrokerError::UnreleasedInstanceId(_) => ResponseError::UnreleasedInstanceId,
        BrokerError::InvalidCommitOffsetSize => ResponseError::InvalidCommitOffsetSize,
        BrokerError::InvalidRegularExpression(_) => ResponseError::InvalidRegularExpression,
        BrokerError::ElectionNotNeeded => ResponseError::ElectionNotNeeded,
        BrokerError::PreferredLeaderNotAvailable(_) => ResponseError::PreferredLeaderNotAvailable,
        BrokerError::EligibleLeadersNotAvailable(_) => ResponseError::EligibleLeadersNotAvailable,
        BrokerError::AtController { code, .. } => {
            ResponseError::try_from_code(*code).unwrap_or(ResponseError::UnknownServerError)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_match_kafka() {
        let table: &[(BrokerError, i16)] = &[
            (BrokerError::OffsetOutOfRange, 1),
            (BrokerError::CorruptMessage(String::new()), 2),
            (BrokerError::UnknownTopicOrPartition, 3),
            (BrokerError::MessageTooLarge(String::new()), 10),
            (BrokerError::InvalidTopic(String::new()), 17),
            (BrokerError::InvalidRequiredAcks, 21),
            (
                BrokerError::RecordErrors {
                    timestamp: true,
                    message: String::new(),
                    records: Vec::new(),
                },
                32,
            ),
            (BrokerError::NotEnoughReplicas, 19),
            (BrokerError::InvalidTxnState, 48),
            (BrokerError::InvalidProducerIdMapping, 49),
            (BrokerError::InvalidTransactionTimeout, 50),
            (BrokerError::ConcurrentTransactions, 51),
            (BrokerError::TransactionCoordinatorFenced, 52),
            (BrokerError::OperationNotAttempted, 55),
            (BrokerError::ProducerFenced, 90),
            (BrokerError::TransactionalIdNotFound, 105),
            (BrokerError::TransactionalIdAuthorizationFailed, 53),
            (BrokerError::UnsupportedVersion, 35),
            (BrokerError::TopicAlreadyExists(String::new()), 36),
            (BrokerError::InvalidPartitions(String::new()), 37),
            (BrokerError::InvalidReplicationFactor(String::new()), 38),
            (BrokerError::InvalidConfig(String::new()), 40),
            (BrokerError::InvalidRequest(String::new()), 42),
            (BrokerError::OutOfOrderSequence, 45),
            (BrokerError::InvalidProducerEpoch, 47),
            (BrokerError::Storage(String::new()), 56),
            (BrokerError::TopicDeletionDisabled, 73),
            (BrokerError::InvalidRecord(String::new()), 87),
            (BrokerError::UnknownTopicId, 100),
            (BrokerError::NotLeaderOrFollower, 6),
            (BrokerError::LeaderNotAvailable, 5),
            (BrokerError::NotController, 41),
            (BrokerError::UnknownLeaderEpoch, 75),
            (BrokerError::FencedLeaderEpoch, 74),
            (BrokerError::RequestTimedOut(String::new()), 7),
            (BrokerError::CoordinatorLoadInProgress, 14),
            (BrokerError::CoordinatorNotAvailable(String::new()), 15),
            (BrokerError::NotCoordinator, 16),
            (BrokerError::IllegalGeneration, 22),
            (BrokerError::InconsistentGroupProtocol, 23),
            (BrokerError::InvalidGroupId, 24),
            (BrokerError::UnknownMemberId, 25),
            (BrokerError::InvalidSessionTimeout, 26),
            (BrokerError::RebalanceInProgress, 27),
            (BrokerError::OffsetMetadataTooLarge, 12),
            (BrokerError::NonEmptyGroup, 68),
            (BrokerError::GroupIdNotFound(String::new()), 69),
            (BrokerError::MemberIdRequired, 79),
            (BrokerError::GroupMaxSizeReached, 81),
            (BrokerError::FencedInstanceId, 82),
            (BrokerError::GroupSubscribedToTopic, 86),
            (BrokerError::FencedMemberEpoch, 110),
            (BrokerError::UnreleasedInstanceId(String::new()), 111),
            (BrokerError::UnsupportedAssignor(String::new()), 112),
            (BrokerError::StaleMemberEpoch, 113),
            (BrokerError::InvalidCommitOffsetSize, 28),
            (BrokerError::InvalidRegularExpression(String::new()), 128),
            (BrokerError::PreferredLeaderNotAvailable(String::new()), 80),
            (BrokerError::EligibleLeadersNotAvailable(String::new()), 83),
            (BrokerError::ElectionNotNeeded, 84),
            (BrokerError::from_controller(36, String::new()), 36),
            (BrokerError::from_controller(41, String::new()), 41),
            (BrokerError::from_controller(7, String::new()), 7),
            (BrokerError::from_controller(37, String::new()), 37),
        ];
        for (e, code) in table {
            assert_eq!(e.code(), *code, "{e:?}");
        }
    }
}
