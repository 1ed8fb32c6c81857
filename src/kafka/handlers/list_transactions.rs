//! ListTransactions (API 66), v0-2: the transactional ids this node coordinates, gathered
//! from every shard, filtered as Kafka filters them: by state name (exact; unknown names are
//! echoed in `unknown_state_filters` and match nothing), by producer id, by duration (v1,
//! KIP-994: running for longer than that many ms; as in Kafka an Empty id, which has no
//! start time, always passes) and by a regular expression the whole id must match (v2,
//! KIP-1152). COORDINATOR_LOAD_IN_PROGRESS while any partition of `__transaction_state`
//! led here is loading; INVALID_REGULAR_EXPRESSION for a pattern that does not compile.

use std::rc::Rc;

use kafka_protocol::messages::list_transactions_response::TransactionState;
use kafka_protocol::messages::{ListTransactionsRequest, ListTransactionsResponse};
use kafka_protocol::protocol::StrBytes;

use crate::errors::BrokerError;
use crate::group;
use crate::kafka::RequestContext;
use crate::txn::TxnState;
use crate::types::now_ms;

/// (transactional id, producer id, state, start time) of one id.
type Listed = (String, i64, TxnState, i64);

pub async fn handle(
    ctx: Rc<RequestContext>,
    req: ListTransactionsRequest,
) -> ListTransactionsResponse {
    let pattern = match req
        .transactional_id_pattern
        .as_deref()
        .filter(|p| !p.is_empty())
    {
        None => None,
        Some(p) => match regex::Regex::new(&format!("^(?:{p})$")) {
            Ok(r) => Some(r),
            Err(e) => {
                return ListTransactionsResponse::default()
                    .with_error_code(BrokerError::InvalidRegularExpression(e.to_string()).code())
            }
        },
    };
    let per_shard: Vec<(bool, Vec<Listed>)> = group::on_every_shard(&ctx.shard, |s| {
        let c = s.txns.borrow();
        let listed = c
            .txns
            .iter()
            .map(|(id, t)| {
                (
                    id.clone(),
                    t.value.producer_id,
                    t.value.state,
                    t.value.start_ms,
                )
            })
            .collect();
        (c.loading(), listed)
    })
    .await;
    if per_shard.iter().any(|(loading, _)| *loading) {
        return ListTransactionsResponse::default()
            .with_error_code(BrokerError::CoordinatorLoadInProgress.code());
    }
    let known = |name: &str| all_states().any(|s| s.name() == name);
    let unknown: Vec<StrBytes> = req
        .state_filters
        .iter()
        .filter(|f| !known(f))
        .cloned()
        .collect();
    let now = now_ms();
    let mut listed: Vec<Listed> = per_shard
        .into_iter()
        .flat_map(|(_, l)| l)
        .filter(|(_, _, state, _)| *state != TxnState::Dead)
        .filter(|(_, _, state, _)| {
            req.state_filters.is_empty() || req.state_filters.iter().any(|f| **f == *state.name())
        })
        .filter(|(_, pid, _, _)| {
            req.producer_id_filters.is_empty()
                || req.producer_id_filters.iter().any(|f| f.0 == *pid)
        })
        .filter(|(_, _, _, start)| req.duration_filter < 0 || now - start > req.duration_filter)
        .filter(|(id, _, _, _)| pattern.as_ref().is_none_or(|p| p.is_match(id)))
        .collect();
    listed.sort_by(|a, b| a.0.cmp(&b.0));
    ListTransactionsResponse::default()
        .with_unknown_state_filters(unknown)
        .with_transaction_states(
            listed
                .into_iter()
                .map(|(id, pid, state, _)| {
                    TransactionState::default()
                        .with_transactional_id(StrBytes::from_string(id).into())
                        .with_producer_id(pid.into())
                        .with_transaction_state(StrBytes::from_static_str(state.name()))
                })
                .collect(),
        )
}

fn all_states() -> impl Iterator<Item = TxnState> {
    (0..=7).filter_map(TxnState::from_id)
}
