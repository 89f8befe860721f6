//! The all-to-all request of the embedding exchange: built the same way by the
//! lookup, the backward and the pooled lookup ([`global_send_request`]), routed per
//! slot ([`route`]) and parsed per source ([`split_message`]).

use crate::allocs::reserve_with_room as reserve_total;
use crate::comm::{Comm, Elem, Received};
use crate::embed::tables::placement::{OutputMode, Placement};
use crate::embed::tables::store::Store;
use crate::Result;

/// A message that breaks the exchange protocol is a bug, not an input error: panic
/// (the panic hook aborts every rank) rather than return on one rank between
/// collectives the others are still in.
pub(in crate::embed) fn protocol_violation(msg: String) -> ! {
    panic!("embedding exchange protocol violated: {msg}")
}

/// For every slot, the indices (into `ids[table]`) of the ids it holds (`rows`
/// tables; into `members`, refilled).
pub(super) fn route<V: AsRef<[u32]>>(store: &Store, ids: &[V], members: &mut Vec<Vec<u32>>) {
    members.resize_with(store.slots.len(), Vec::new);
    members.iter_mut().for_each(Vec::clear);
    for (t, ids) in ids.iter().enumerate() {
        let ids = ids.as_ref();
        if store.is_replicated(t) || store.plan.mode(t) == OutputMode::Pooled {
            continue;
        }
        if let Placement::Column { .. } = store.plan.tables[t] {
            for &s in &store.table_slots[t] {
                members[s].extend(0..ids.len() as u32);
            }
        } else {
            for (i, &id) in ids.iter().enumerate() {
                let s = store.row_slot(t, id as u64).expect("row placement");
                members[s].push(i as u32);
            }
        }
    }
}

/// Split one source's message into its header (one count per slot the receiver
/// owns) and body, checking that they agree.
pub(super) fn split_message<T: Copy>(
    msg: &[T],
    slots: usize,
    per_item: impl Fn(usize) -> usize,
    count: impl Fn(T) -> usize,
    from: usize,
) -> Result<(Vec<usize>, &[T])> {
    if msg.len() < slots {
        protocol_violation(format!(
            "rank {from} sent {} values, fewer than the {slots}-slot header",
            msg.len()
        ));
    }
    let (hdr, body) = msg.split_at(slots);
    let counts: Vec<usize> = hdr.iter().map(|&c| count(c)).collect();
    let want: usize = counts
        .iter()
        .enumerate()
        .map(|(j, &c)| c * per_item(j))
        .sum();
    if want != body.len() {
        protocol_violation(format!(
            "rank {from}: header announces {want} values, body has {}",
            body.len()
        ));
    }
    Ok((counts, body))
}

/// Collective: every rank must call. Sends one all-to-all-v request in the layout
/// every exchange uses (the lookup's ids, the backward's gradients, the pooled
/// lookup's bags): per destination rank in rank order, the message `write` appends
/// for the slots that rank owns (`owned[d]`). `send` is cleared and reserved once for
/// `size(s)` values per owned slot `s`, and left with unspecified contents; the
/// messages arrive in `recv`, timed under the communication phase `phase`.
pub(in crate::embed) fn global_send_request<C: Comm, T: Elem>(
    comm: &C,
    phase: &'static str,
    owned: &[Vec<usize>],
    send: &mut Vec<T>,
    size: impl Fn(usize) -> usize,
    mut write: impl FnMut(&[usize], &mut Vec<T>),
    recv: &mut Received<T>,
) -> Result<()> {
    send.clear();
    let total: usize = owned.iter().flatten().map(|&s| size(s)).sum();
    reserve_total(send, total);
    let mut send_counts = vec![0usize; comm.size()];
    for (d, owned) in owned.iter().enumerate() {
        let start = send.len();
        write(owned, send);
        send_counts[d] = send.len() - start;
    }
    let _p = comm.stats().phase(phase);
    comm.all_to_all_v_move(send, &send_counts, recv)
}
