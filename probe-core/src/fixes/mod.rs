//! Fixes as data (pure): for a confirmed loopback (its kind and facts) and a provider profile,
//! the ready fixes, best fit first. Separate from the prose remedies (`correlate::remedy`):
//! those explain, these are changes a tool can show, apply and undo.
//!
//! One table, [`TABLE`]: the generic entries (`generic.rs`), then the providers' own
//! (`aws.rs`, `clouds.rs`). Each entry's doc comment cites the provider's own document or
//! controller source (with the version it needs) and names the fact that gates it; its
//! `offer` decides from the facts: an entry whose change is already in place, or that the
//! facts contradict, offers nothing.
//!
//! Azure and GCE have no entry: neither documents a Service-level setting for a backend calling
//! its own LB (see `clouds.rs` for where we looked), so they get the generic fixes that fit.

mod aws;
mod clouds;
mod generic;
#[cfg(test)]
mod lb_probe_tests;
pub mod provider;
#[cfg(test)]
mod table_tests;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use probe_contract::{
    Caller, Fix, Layer, LoopbackEvent, LoopbackKind, Outcome, Proto, SnatState,
    facts::{AddressOwner, SelfLoopMissing, SourceKind},
};
use serde_json::{Value, json};

pub use self::provider::{Origin, Profile, Provider};
use crate::{correlate::lb_probe_refused::KUBE_PROXY_HEALTHZ_PORT, service::ServiceFacts};

/// `externalTrafficPolicy` / `ipMode` as read: None when not read (no API access).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Etp {
    Local,
    Cluster,
}

/// `status.loadBalancer.ingress[].ipMode` of the LB IP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IpMode {
    /// `VIP`, or unset on an ingress entry that has an IP (the default).
    Vip,
    Proxy,
    /// Any other value (e.g. KEP-6272's proposed `Router`), kept as written: kube-proxy's
    /// `IsVIPMode` (pkg/proxy/util/utils.go) programs only unset or `VIP`.
    Other(String),
}

impl IpMode {
    /// The API's spelling of a set value.
    pub fn from_api(value: &str) -> IpMode {
        match value {
            "VIP" => IpMode::Vip,
            "Proxy" => IpMode::Proxy,
            other => IpMode::Other(other.to_string()),
        }
    }

    /// As the API spells it (`VIP` also for unset).
    pub fn as_str(&self) -> &str {
        match self {
            IpMode::Vip => "VIP",
            IpMode::Proxy => "Proxy",
            IpMode::Other(v) => v,
        }
    }
}

/// Who sent the looping packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A pod (its own address).
    Pod,
    /// The node itself or a host-network pod.
    Node,
    /// The LB (its health checks).
    Lb,
}

impl Source {
    /// Who sent it, from the kind's caller (the contract's `KINDS`), whether the event names a
    /// client pod, and whether its facts say the node made the call. None: not known.
    pub fn of(caller: Caller, names_pod: bool, node_called: bool) -> Option<Source> {
        match caller {
            Caller::Lb => Some(Source::Lb),
            Caller::Pod => Some(Source::Pod),
            Caller::Node => Some(Source::Node),
            Caller::PodOrNode if node_called => Some(Source::Node),
            Caller::PodOrNode => Some(Source::Pod),
            Caller::PodIfNamed => names_pod.then_some(Source::Pod),
        }
    }
}

/// The facts the table reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    pub kind: LoopbackKind,
    pub provider: Provider,
    pub proto: Proto,
    /// The Service port the loop went through (the LB listener), when known.
    pub port: Option<u16>,
    pub source: Option<Source>,
    pub snat: SnatState,
    /// `l4` / `l7` of a hairpin (an Ingress's layer-7 LB opens its own connection).
    pub layer: Option<Layer>,
    /// `namespace/name`; fixes with a patch need it.
    pub service: Option<String>,
    pub etp: Option<Etp>,
    pub ip_mode: Option<IpMode>,
    /// The LB IP is published as an IP in the Service's status (false: a hostname only, or
    /// another IP); None when not read.
    pub lb_ip_published: Option<bool>,
    /// kube-proxy's rules were read on the node (false: no kube-proxy); None when not known.
    pub kube_proxy: Option<bool>,
    /// The Service was read from the API (so `annotations`/`load_balancer_class` are known,
    /// not just empty).
    pub service_read: bool,
    pub load_balancer_class: Option<String>,
    pub annotations: BTreeMap<String, String>,
    /// kube-proxy is what makes the LB IP local (bound on the VIP interface, or owner not
    /// known): false when a NIC address or a `local` route does (keepalived, a cloud guest
    /// agent), which ipMode or a hostname annotation does not undo.
    pub kube_proxy_binds: bool,
    /// `service_self_loop`: the missing piece of the hairpin.
    pub self_loop: Option<SelfLoopMissing>,
    /// `lb_probe_refused`: what the LB probed and how it died.
    pub lb_probe: Option<LbProbe>,
}

/// The LB's node probe of an `lb_probe_refused` event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LbProbe {
    /// It probed kube-proxy's healthz port (:10256), not a healthCheckNodePort.
    pub healthz: bool,
    /// Nothing listened there (the kernel answered with a RST), not a drop.
    pub refused: bool,
}

impl LbProbe {
    /// The probe of `event`, when it is an `lb_probe_refused` one.
    pub fn of(event: &LoopbackEvent) -> Option<LbProbe> {
        (event.kind == LoopbackKind::LbProbeRefused).then(|| LbProbe {
            healthz: event.dst_port == KUBE_PROXY_HEALTHZ_PORT,
            refused: event.outcome == Outcome::Refused,
        })
    }
}

impl Facts {
    /// The facts of `event`, with `service` when the API named it.
    pub fn of(event: &LoopbackEvent, service: Option<&ServiceFacts>, provider: Provider) -> Facts {
        let source = Source::of(
            event.kind.spec().caller,
            event.client_pod.is_some(),
            event.facts.source == SourceKind::Node,
        );
        Facts {
            kind: event.kind,
            provider,
            proto: event.proto,
            port: event.vip_port,
            source,
            snat: event.snat,
            layer: event.layer,
            service: service
                .map(ServiceFacts::key)
                .or_else(|| event.service.as_deref().map(service_key)),
            etp: service.map(etp_of),
            ip_mode: service.and_then(|s| ip_mode_of(s, event.vip)),
            lb_ip_published: service
                .zip(event.vip)
                .map(|(s, vip)| s.ingress.iter().any(|i| i.ip == Some(vip))),
            // A service table read means kube-proxy's rules are there; none read says nothing.
            kube_proxy: event.facts.proxy_mode.map(|_| true),
            service_read: service.is_some(),
            load_balancer_class: service.and_then(|s| s.load_balancer_class.clone()),
            annotations: service.map(|s| s.annotations.clone()).unwrap_or_default(),
            kube_proxy_binds: !matches!(
                event.facts.owner,
                Some(AddressOwner::Interface { .. } | AddressOwner::LocalRoute { .. })
            ),
            self_loop: event.facts.self_loop.clone(),
            lb_probe: LbProbe::of(event),
        }
    }

    /// The facts of a `probe check` risk of `kind` on LB IP `vip` of `service`: a hairpin risk
    /// is a pod's un-SNATed call, a health-check one the LB's own checks. The protocol is the
    /// Service's when all its ports share one ([`Facts::with_port`] names the port).
    pub fn of_risk(
        kind: LoopbackKind,
        vip: std::net::IpAddr,
        service: &ServiceFacts,
        provider: Provider,
    ) -> Facts {
        let source = Source::of(kind.spec().caller, false, false);
        let all_udp = !service.ports.is_empty()
            && service
                .ports
                .iter()
                .all(|p| p.protocol.eq_ignore_ascii_case("UDP"));
        Facts {
            kind,
            provider,
            proto: if all_udp { Proto::Udp } else { Proto::Tcp },
            port: None,
            source,
            snat: SnatState::No,
            layer: None,
            service: Some(service.key()),
            etp: Some(etp_of(service)),
            ip_mode: ip_mode_of(service, Some(vip)),
            lb_ip_published: Some(service.ingress.iter().any(|i| i.ip == Some(vip))),
            kube_proxy: None,
            service_read: true,
            load_balancer_class: service.load_balancer_class.clone(),
            annotations: service.annotations.clone(),
            kube_proxy_binds: true,
            self_loop: None,
            lb_probe: None,
        }
    }

    /// The loop's Service port and protocol.
    pub fn with_port(mut self, port: u16, proto: Proto) -> Facts {
        self.port = Some(port);
        self.proto = proto;
        self
    }

    /// Whether kube-proxy writes rules for this LB IP: only for an IP published in the
    /// Service's status (a hostname gets none) whose ipMode is unset or `VIP` (kube-proxy's
    /// `IsVIPMode`, pkg/proxy/util/utils.go), on a node where kube-proxy runs. None when a
    /// fact is not known (an unknown ipMode value included: KEP-6272's proposed `Router`
    /// would be programmed).
    pub fn kube_proxy_programs_lb_ip(&self) -> Option<bool> {
        if self.kube_proxy == Some(false)
            || self.lb_ip_published == Some(false)
            || self.ip_mode == Some(IpMode::Proxy)
        {
            return Some(false);
        }
        match (&self.ip_mode, self.kube_proxy, self.lb_ip_published) {
            (Some(IpMode::Vip), Some(true), Some(true)) => Some(true),
            _ => None,
        }
    }
}

fn etp_of(s: &ServiceFacts) -> Etp {
    if s.is_etp_local() {
        Etp::Local
    } else {
        Etp::Cluster
    }
}

/// The ipMode of `vip` as written; unset on an ingress that has an IP means VIP.
fn ip_mode_of(s: &ServiceFacts, vip: Option<std::net::IpAddr>) -> Option<IpMode> {
    match vip.and_then(|vip| s.ip_mode(vip)) {
        Some(mode) => Some(IpMode::from_api(mode)),
        None if s.ingress.iter().any(|i| i.ip.is_some()) => Some(IpMode::Vip),
        None => None,
    }
}

/// The provider a Service's own settings name.
pub fn service_provider(service: &ServiceFacts) -> Option<Provider> {
    let hostnames: Vec<&str> = service
        .ingress
        .iter()
        .filter_map(|i| i.hostname.as_deref())
        .collect();
    Provider::from_service(
        service.load_balancer_class.as_deref(),
        &service.annotations,
        &hostnames,
    )
}

/// `namespace/name` of a service label (`namespace/name:port-name`).
pub fn service_key(label: &str) -> String {
    label.split(':').next().unwrap_or(label).to_string()
}

/// What an entry offers for some facts.
struct Offer {
    /// Fit, higher first (ties keep table order).
    score: u8,
    patch: Option<(Value, Value)>,
    preconditions: Vec<String>,
}

impl Offer {
    /// Advice without a patch.
    fn advice(score: u8) -> Offer {
        Offer {
            score,
            patch: None,
            preconditions: vec![],
        }
    }
}

/// One row of the table.
pub struct Entry {
    pub id: &'static str,
    pub provider: Provider,
    pub kinds: &'static [LoopbackKind],
    pub change: &'static str,
    pub preconditions: &'static [&'static str],
    pub side_effects: &'static [&'static str],
    pub source: &'static str,
    offer: fn(&Facts) -> Option<Offer>,
}

/// The fixes, generic first, then per provider.
pub static TABLE: &[&Entry] = &[
    &generic::CALL_BY_SERVICE_NAME,
    &generic::ETP_CLUSTER,
    &generic::IP_MODE_PROXY,
    &generic::SNAT_POD_EGRESS_TO_LB,
    &generic::LB_HEALTHCHECK_SOURCE,
    &generic::RESTORE_POD_HAIRPIN,
    &generic::KUBE_PROXY_NFTABLES_FIX,
    &generic::LOCAL_ENDPOINT_EVERY_NODE,
    &generic::KUBE_PROXY_HEALTHZ_BIND,
    &generic::CILIUM_KPR_HEALTHZ_BIND,
    &aws::NLB_TARGET_TYPE_IP,
    &aws::PRESERVE_CLIENT_IP_OFF,
    &aws::IN_TREE_PRESERVE_CLIENT_IP_OFF,
    &clouds::TENCENT_PREVENT_LOOPBACK,
    &clouds::TENCENT_HEALTHCHECK_SOURCE,
    &clouds::TENCENT_INGRESS_KEEPALIVE,
    &clouds::ACK_LB_HOSTNAME,
    &clouds::HCLOUD_DISABLE_PRIVATE_INGRESS,
    &clouds::OPENSTACK_LB_HOSTNAME,
    &clouds::DO_LB_HOSTNAME,
];

/// Sets one annotation; the undo restores its old value (or removes it: null in a merge patch).
fn annotation_patch(f: &Facts, key: &str, value: &str) -> (Value, Value) {
    let old = f
        .annotations
        .get(key)
        .map_or(Value::Null, |v| Value::String(v.clone()));
    (
        json!({"metadata": {"annotations": {key: value}}}),
        json!({"metadata": {"annotations": {key: old}}}),
    )
}

/// A boolean annotation is on (`"true"`, as the controllers parse it).
fn annotation_on(f: &Facts, key: &str) -> bool {
    f.annotations
        .get(key)
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// What `entry` offers for `facts` (its fit and the fix), None when nothing.
fn offer(e: &Entry, facts: &Facts) -> Option<(u8, Fix)> {
    let offer = (e.offer)(facts)?;
    if offer.patch.is_some() && facts.service.is_none() {
        return None;
    }
    let mut preconditions: Vec<String> = e.preconditions.iter().map(|p| p.to_string()).collect();
    preconditions.extend(offer.preconditions);
    // A patch or undo built from an annotation value the agent's index cut
    // (`crate::untrusted`) would write the cut value: no patch then (the plugin reads the
    // whole Service and computes it).
    let (patch, undo) = match offer.patch {
        Some((patch, undo))
            if crate::untrusted::is_cut(&patch.to_string())
                || crate::untrusted::is_cut(&undo.to_string()) =>
        {
            preconditions.push(
                "an annotation it changes is too long to carry here: `kubectl clb-probe fix` \
                 computes the patch from the whole Service"
                    .into(),
            );
            (None, None)
        }
        patch => patch.unzip(),
    };
    if e.provider != Provider::Generic && !facts.service_read {
        preconditions.push("the Service's annotations were not read (no API access)".into());
    }
    Some((
        offer.score,
        Fix {
            id: e.id.to_string(),
            provider: e.provider.as_str().to_string(),
            change: e.change.to_string(),
            service: patch.as_ref().and(facts.service.clone()),
            patch,
            undo,
            preconditions,
            side_effects: e.side_effects.iter().map(|s| s.to_string()).collect(),
            source: e.source.to_string(),
        },
    ))
}

/// The fixes for `facts`, best fit first. Patch fixes need the Service's name.
pub fn fixes(facts: &Facts) -> Vec<Fix> {
    let mut offered: Vec<(u8, usize, Fix)> = TABLE
        .iter()
        .enumerate()
        .filter(|(_, e)| {
            e.kinds.contains(&facts.kind)
                && (e.provider == Provider::Generic || e.provider == facts.provider)
        })
        .filter_map(|(i, e)| offer(e, facts).map(|(score, fix)| (score, i, fix)))
        .collect();
    offered.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    offered.into_iter().map(|(_, _, fix)| fix).collect()
}

/// The fix `id` as the table offers it for `facts` (whatever its provider: the agent that
/// chose it may have known better), None when unknown or when it offers nothing for them
/// (already in place, or the facts now contradict it).
pub fn fix_by_id(id: &str, facts: &Facts) -> Option<Fix> {
    let e = TABLE.iter().find(|e| e.id == id)?;
    offer(e, facts).map(|(_, fix)| fix)
}
