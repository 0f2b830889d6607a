//! Which cloud runs the LB: the provider profile that selects the provider's own fixes.
//!
//! Read, in this order: `--provider` (env `CLB_PROBE_PROVIDER`), the scheme of a Node's
//! `spec.providerID` (`aws://...`, `gce://...`), then what the Service itself says (its
//! `loadBalancerClass`, the prefix of its LB controller's annotations, an ELB hostname in
//! `status.loadBalancer.ingress`); else `generic`. Only explicit schemes and annotation
//! prefixes count: a guess from an address or a name would pick the wrong annotations.

use std::{collections::BTreeMap, fmt, str::FromStr};

/// A cloud whose LB controller we know.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Provider {
    Aws,
    Azure,
    Gce,
    /// Alibaba Cloud (ACK).
    Alicloud,
    /// Tencent Cloud (TKE).
    Tencent,
    Hcloud,
    DigitalOcean,
    OpenStack,
    Generic,
}

impl Provider {
    pub const ALL: [Provider; 9] = [
        Provider::Aws,
        Provider::Azure,
        Provider::Gce,
        Provider::Alicloud,
        Provider::Tencent,
        Provider::Hcloud,
        Provider::DigitalOcean,
        Provider::OpenStack,
        Provider::Generic,
    ];

    /// The spelling of `--provider` and of [`probe_contract::Fix::provider`].
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Aws => "aws",
            Provider::Azure => "azure",
            Provider::Gce => "gce",
            Provider::Alicloud => "alicloud",
            Provider::Tencent => "tencentcloud",
            Provider::Hcloud => "hcloud",
            Provider::DigitalOcean => "digitalocean",
            Provider::OpenStack => "openstack",
            Provider::Generic => "generic",
        }
    }

    /// The provider named by a Node's `spec.providerID` scheme (`aws:///eu-west-1a/i-0abc`).
    /// `qcloud` is TKE's scheme, `alibaba`/`alibabacloud` spellings are accepted with
    /// `alicloud`, `hrobot` (Hetzner dedicated servers) with `hcloud`. ACK writes no scheme:
    /// `<region>.<instance-id>` (cloud-provider-alibaba-cloud
    /// pkg/provider/alibaba/util/helper.go `NodeFromProviderID`: "REGION.NODEID", e.g.
    /// `cn-hangzhou.i-bp1abcdef123456`), recognised by that exact shape. None for another
    /// scheme or none.
    pub fn from_provider_id(id: &str) -> Option<Provider> {
        let Some((scheme, _)) = id.split_once("://") else {
            return is_ack_provider_id(id).then_some(Provider::Alicloud);
        };
        Some(match scheme.to_ascii_lowercase().as_str() {
            "aws" => Provider::Aws,
            "azure" => Provider::Azure,
            "gce" => Provider::Gce,
            "alicloud" | "alibaba" | "alibabacloud" => Provider::Alicloud,
            "tencentcloud" | "qcloud" => Provider::Tencent,
            "hcloud" | "hrobot" => Provider::Hcloud,
            "digitalocean" => Provider::DigitalOcean,
            "openstack" => Provider::OpenStack,
            _ => return None,
        })
    }

    /// The provider a Service's own settings name: its `loadBalancerClass`, its LB controller's
    /// annotation prefixes, an AWS ELB ingress hostname.
    pub fn from_service(
        load_balancer_class: Option<&str>,
        annotations: &BTreeMap<String, String>,
        ingress_hostnames: &[&str],
    ) -> Option<Provider> {
        // The LB controller's class, and EKS Auto Mode's `eks.amazonaws.com/nlb`.
        if let Some(class) = load_balancer_class
            && (class.starts_with("service.k8s.aws/") || class.starts_with("eks.amazonaws.com/"))
        {
            return Some(Provider::Aws);
        }
        for key in annotations.keys() {
            if let Some((_, p)) = ANNOTATION_PREFIXES
                .iter()
                .find(|(pre, _)| key.starts_with(pre))
            {
                return Some(*p);
            }
        }
        ingress_hostnames
            .iter()
            .any(|h| h.ends_with(".elb.amazonaws.com"))
            .then_some(Provider::Aws)
    }
}

/// The annotation prefixes of each provider's LB controller: a Service's provider is named by
/// them, and they are the annotations the agent keeps of a Service (`kube::index`: the fixes
/// and remedies read no other).
pub const ANNOTATION_PREFIXES: [(&str, Provider); 10] = [
    (
        "service.beta.kubernetes.io/aws-load-balancer-",
        Provider::Aws,
    ),
    ("service.beta.kubernetes.io/azure-", Provider::Azure),
    ("cloud.google.com/", Provider::Gce),
    ("networking.gke.io/", Provider::Gce),
    (
        "service.beta.kubernetes.io/alibaba-cloud-",
        Provider::Alicloud,
    ),
    ("service.beta.kubernetes.io/alicloud-", Provider::Alicloud),
    ("service.cloud.tencent.com/", Provider::Tencent),
    ("load-balancer.hetzner.cloud/", Provider::Hcloud),
    (
        "service.beta.kubernetes.io/do-loadbalancer-",
        Provider::DigitalOcean,
    ),
    ("loadbalancer.openstack.org/", Provider::OpenStack),
];

/// `<region>.i-<id>`: a region of lowercase letters and digits in dash-separated parts
/// (`cn-hangzhou`, `ap-southeast-1`), then an ECS instance id (`i-` and lowercase
/// alphanumerics). Nothing looser: a guess would pick the wrong annotations.
fn is_ack_provider_id(id: &str) -> bool {
    let Some((region, instance)) = id.split_once('.') else {
        return false;
    };
    let alnum = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    };
    let parts: Vec<&str> = region.split('-').collect();
    parts.len() >= 2
        && parts[0].len() == 2
        && parts.iter().all(|p| alnum(p))
        && instance.strip_prefix("i-").is_some_and(alnum)
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `--provider` named no profile.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown provider {0:?} (one of: {list})", list = Provider::ALL.map(Provider::as_str).join(", "))]
pub struct UnknownProvider(pub String);

impl FromStr for Provider {
    type Err = UnknownProvider;

    /// `--provider`: a profile name, or a providerID scheme spelling (`qcloud`, `alibaba`).
    fn from_str(s: &str) -> Result<Provider, UnknownProvider> {
        let s = s.trim().to_ascii_lowercase();
        if let Some(p) = Provider::ALL.iter().find(|p| p.as_str() == s) {
            return Ok(*p);
        }
        Provider::from_provider_id(&format!("{s}://")).ok_or(UnknownProvider(s))
    }
}

/// Where the profile came from (shown with the fixes, so a wrong one can be overridden).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    Flag,
    NodeProviderId,
    Service,
    Default,
}

/// The provider profile of one Service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Profile {
    pub provider: Provider,
    pub origin: Origin,
}

impl Profile {
    pub const GENERIC: Profile = Profile {
        provider: Provider::Generic,
        origin: Origin::Default,
    };

    /// The profile from (in order) the flag, the Nodes' providerIDs (the first with a known
    /// scheme), the Service's own settings.
    pub fn resolve<'a>(
        flag: Option<Provider>,
        provider_ids: impl IntoIterator<Item = &'a str>,
        service: Option<Provider>,
    ) -> Profile {
        if let Some(provider) = flag {
            return Profile {
                provider,
                origin: Origin::Flag,
            };
        }
        if let Some(provider) = provider_ids
            .into_iter()
            .find_map(Provider::from_provider_id)
        {
            return Profile {
                provider,
                origin: Origin::NodeProviderId,
            };
        }
        match service {
            Some(provider) => Profile {
                provider,
                origin: Origin::Service,
            },
            None => Profile::GENERIC,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids_name_their_cloud_and_nothing_else() {
        for (id, want) in [
            ("aws:///eu-west-1a/i-0abc", Some(Provider::Aws)),
            ("azure:///subscriptions/x/vm-1", Some(Provider::Azure)),
            ("gce://proj/europe-west1-b/vm", Some(Provider::Gce)),
            ("alicloud://cn-hangzhou.i-abc", Some(Provider::Alicloud)),
            // ACK: no scheme.
            ("cn-hangzhou.i-bp1abcdef123456", Some(Provider::Alicloud)),
            ("ap-southeast-1.i-t4n0abc", Some(Provider::Alicloud)),
            ("cn-hangzhou.vm-1", None),
            ("node-1.example.com", None),
            ("hrobot://123", Some(Provider::Hcloud)),
            ("qcloud:///800002/ins-abc", Some(Provider::Tencent)),
            ("tencentcloud://ins-abc", Some(Provider::Tencent)),
            ("hcloud://123", Some(Provider::Hcloud)),
            ("digitalocean://123", Some(Provider::DigitalOcean)),
            ("openstack:///uuid", Some(Provider::OpenStack)),
            ("kind://docker/kind/kind-control-plane", None),
            ("i-0abc", None),
            ("", None),
        ] {
            assert_eq!(Provider::from_provider_id(id), want, "{id}");
        }
    }

    #[test]
    fn the_flag_wins_then_the_node_then_the_service() {
        let ann: BTreeMap<String, String> = [(
            "service.beta.kubernetes.io/do-loadbalancer-name".to_string(),
            "x".to_string(),
        )]
        .into();
        let svc = Provider::from_service(None, &ann, &[]);
        assert_eq!(svc, Some(Provider::DigitalOcean));
        let p = Profile::resolve(Some(Provider::Gce), ["aws:///a/i-1"], svc);
        assert_eq!((p.provider, p.origin), (Provider::Gce, Origin::Flag));
        let p = Profile::resolve(None, ["kind://x", "aws:///a/i-1"], svc);
        assert_eq!(
            (p.provider, p.origin),
            (Provider::Aws, Origin::NodeProviderId)
        );
        let p = Profile::resolve(None, [], svc);
        assert_eq!(
            (p.provider, p.origin),
            (Provider::DigitalOcean, Origin::Service)
        );
        assert_eq!(Profile::resolve(None, [], None), Profile::GENERIC);
        assert_eq!(
            Provider::from_service(Some("service.k8s.aws/nlb"), &BTreeMap::new(), &[]),
            Some(Provider::Aws)
        );
        assert_eq!(
            Provider::from_service(Some("eks.amazonaws.com/nlb"), &BTreeMap::new(), &[]),
            Some(Provider::Aws)
        );
        let p = Profile::resolve(None, ["cn-hangzhou.i-bp1abcdef123456"], None);
        assert_eq!(
            (p.provider, p.origin),
            (Provider::Alicloud, Origin::NodeProviderId)
        );
        assert_eq!(
            Provider::from_service(None, &BTreeMap::new(), &["a-1.elb.amazonaws.com"]),
            Some(Provider::Aws)
        );
    }

    #[test]
    fn the_flag_takes_names_and_schemes_and_rejects_the_rest() {
        assert_eq!("AWS".parse::<Provider>(), Ok(Provider::Aws));
        assert_eq!("qcloud".parse::<Provider>(), Ok(Provider::Tencent));
        assert_eq!("generic".parse::<Provider>(), Ok(Provider::Generic));
        let err = "ibm".parse::<Provider>().unwrap_err();
        assert!(
            err.to_string().contains("unknown provider \"ibm\""),
            "{err}"
        );
    }
}
