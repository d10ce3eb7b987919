//! Service ID resolution (SIDR REQ/REP): how rdma_cm's `RDMA_PS_UDP` ids find a UD QP and
//! its Q_Key.

use super::ids::St;
use super::mad::{self, IpHeader, Msg, SidrRep, private};
use super::{CmEvent, CmEventKind, CmId, ConnParam, PortSpace};
use crate::qp::Transport;
use crate::state::State;

impl State {
    pub(super) fn on_sidr_req(
        &mut self,
        dev: usize,
        from: [u8; 16],
        tid: u64,
        rid: u32,
        sid: u64,
        data: &[u8],
    ) -> bool {
        if self.duplicate_request(dev, from, rid) {
            return true;
        }
        let rep = |status| {
            Msg::SidrRep(Box::new(SidrRep {
                request_id: rid,
                status,
                qpn: 0,
                service_id: sid,
                qkey: 0,
                private: [0; private::SIDR_REP],
            }))
        };
        let ip = IpHeader::parse(data);
        let listener = match (mad::split_service_id(sid), ip) {
            (Some((mad::ps::UDP, port)), Some(ip)) => {
                self.listener(dev, PortSpace::Udp, port, ip.dst)
            }
            _ => None,
        };
        let (Some(l), Some(ip)) = (listener, ip) else {
            self.w.answer(dev, &from, tid, &rep(1));
            return true;
        };
        let li = &self.w.cm.ids[&l];
        if li.queued >= li.backlog {
            self.w.answer(dev, &from, tid, &rep(2));
            return true;
        }
        self.new_request(dev, from, tid, l, rid, ip, ConnParam::default(), data);
        true
    }

    pub(super) fn on_sidr_rep(&mut self, dev: usize, from: [u8; 16], r: &SidrRep) -> bool {
        let Some(id) = self.w.conn(dev, &from, r.request_id) else {
            return false;
        };
        let i = &self.w.cm.ids[&id];
        if i.st != St::ReqSent || i.ps.transport() != Transport::Ud {
            return false;
        }
        self.w.cm_settle(id);
        let ok = r.status == 0;
        let i = self.w.cm.ids.get_mut(&id).expect("there");
        i.st = if ok { St::Established } else { St::Done };
        i.remote_qpn = r.qpn;
        i.remote_qkey = r.qkey;
        let ev = CmEvent {
            kind: if ok {
                CmEventKind::Established
            } else {
                CmEventKind::Unreachable
            },
            id: CmId(id),
            listen_id: None,
            status: i32::from(r.status),
            private: r.private.to_vec(),
            param: ConnParam {
                qp_num: r.qpn,
                qkey: r.qkey,
                ..ConnParam::default()
            },
            peer_gid: from,
            addrs: None,
        };
        self.w.cm.push(id, ev);
        true
    }
}
