//! The fake Kubernetes API for a test, set up in one place: the in-process server
//! (`test_support::kubeapi::FakeApiServer`) with the lab's objects (Node, Pods, Services,
//! EndpointSlices: `fixtures::lab()`) or the test's own, a kubeconfig pointing at it in a
//! scratch directory, and the agent started in the lab's node with that kubeconfig.
//!
//! ```text
//! let api = KubeFixture::lab(); // the lab's objects, in the node's namespace
//! api.forbid("pods", "list"); // the server as the test wants it, before the agent
//! let agent = api.start_agent(&["--kube-events", "off"]);
//! ```
//!
//! A [`KubeFixture`] derefs to its [`FakeApiServer`] (`api.objects(..)`, `api.requests()`).
//! Drop the agent before it (declare the agent after it): the agent's last writes go to a
//! server that still answers.

use std::{
    ffi::OsStr,
    net::IpAddr,
    ops::Deref,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use serde_json::Value;
use test_support::{
    kubeapi::{FakeApiServer, fixtures},
    lab,
};

use crate::agent::{Agent, probe_bin, tempdir::TempDir};

/// The node name the lab's fixtures give the node the agent runs on.
pub const NODE_NAME: &str = "clb-node";

/// `kubectl-clb_probe` (the kubectl plugin), built beside the probe under test.
pub fn plugin_bin() -> PathBuf {
    probe_bin().with_file_name("kubectl-clb_probe")
}

/// `kubectl-clb_probe --kubeconfig K ARGS` run in the lab's node namespace, where the fake
/// API server listens on 127.0.0.1 (`Listen::Node`).
pub fn plugin_in_node(api: &KubeFixture, args: &[&str]) -> std::process::Output {
    std::process::Command::new("ip")
        .args(["netns", "exec", lab::NS_NODE])
        .arg(plugin_bin())
        .args(["--kubeconfig", api.kubeconfig()])
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .expect("run kubectl-clb_probe")
}

/// Where the server listens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listen {
    /// 127.0.0.1 of the test's own namespace (the kubectl plugin's tests: no lab).
    Host,
    /// 127.0.0.1 inside the lab's node, where the agent runs.
    Node,
    /// Every address of the lab's node: the lab's other namespaces reach it through the node's
    /// address ([`KubeFixture::kubeconfig_via`]), as agents on other nodes reach the API server.
    NodeForAll,
}

/// What varies between the tests' servers; [`KubeFixture::builder`].
pub struct Builder {
    objects: Vec<Value>,
    listen: Listen,
    tag: String,
}

impl Builder {
    /// These objects instead of the lab's.
    pub fn objects(mut self, objects: Vec<Value>) -> Self {
        self.objects = objects;
        self
    }

    /// One object more.
    pub fn object(mut self, object: Value) -> Self {
        self.objects.push(object);
        self
    }

    pub fn listen(mut self, listen: Listen) -> Self {
        self.listen = listen;
        self
    }

    /// Names the scratch directory that holds the kubeconfig (`clb-probe-test-<tag>-...`).
    pub fn tag(mut self, tag: &str) -> Self {
        self.tag = tag.to_owned();
        self
    }

    /// The server with the objects, and its kubeconfig written.
    pub fn start(self) -> KubeFixture {
        let server = match self.listen {
            Listen::Host => FakeApiServer::start(),
            Listen::Node => FakeApiServer::start_in_netns(lab::NS_NODE),
            Listen::NodeForAll => FakeApiServer::start_in_netns_for_all(lab::NS_NODE),
        }
        .expect("fake API server");
        for object in self.objects {
            server.apply(object);
        }
        let dir = TempDir::new(&self.tag);
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
        KubeFixture {
            server,
            kubeconfig: kubeconfig.to_str().expect("a UTF-8 temp dir").to_owned(),
            dir,
        }
    }
}

/// The lab's objects with the Service `default/web` also serving the lab's unserved port
/// (`https`, [`lab::VIP_UNSERVED_PORT`]) with an endpoint, which the lab's kube-proxy rules
/// (like a kube-proxy that has not synced) do not program: the API and the node disagree.
pub fn lab_objects_with_unprogrammed_port() -> Vec<Value> {
    let mut objects = fixtures::lab();
    let web = objects
        .iter_mut()
        .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == "web")
        .expect("the lab's Service web");
    web["spec"]["ports"]
        .as_array_mut()
        .expect("ports")
        .push(serde_json::json!({
            "name": "https", "protocol": "TCP", "port": lab::VIP_UNSERVED_PORT,
            "targetPort": 8443, "nodePort": 30443
        }));
    // With an endpoint: kube-proxy programs a port only when it has one (else it REJECTs it
    // in the filter table, which is an unserved port in both views).
    let slice = objects
        .iter_mut()
        .find(|o| o["kind"] == "EndpointSlice" && o["metadata"]["name"] == "web-x7k2d")
        .expect("the lab's EndpointSlice of web");
    slice["ports"]
        .as_array_mut()
        .expect("ports")
        .push(serde_json::json!({ "name": "https", "protocol": "TCP", "port": 8443 }));
    objects
}

/// The confirmation of a call to the port [`lab_objects_with_unprogrammed_port`] adds: the
/// unserved port on the LB IP, named as kube-proxy lagging the API (the dataplane read that
/// found no rule named by `dataplane`), with kube-proxy, not the Service, as the remedy.
pub fn assert_unprogrammed_port_named(e: &probe_contract::LoopbackEvent, dataplane: &str) {
    assert_eq!(
        (e.vip, e.vip_port),
        (Some(IpAddr::V4(lab::VIP)), Some(lab::VIP_UNSERVED_PORT))
    );
    assert!(e.facts.kube_proxy_lags, "{e:#?}");
    let evidence = crate::agent::lines(&e.evidence);
    assert!(
        evidence.contains(
            "the API and this node disagree: default/web:https serves 203.0.113.10:443/tcp"
        ),
        "{evidence}"
    );
    assert!(evidence.contains(dataplane), "{evidence}");
    assert!(
        e.remedy[0].contains("kube-proxy on this node has not programmed it"),
        "{:#?}",
        e.remedy
    );
    assert!(
        !e.remedy
            .iter()
            .any(|r| r.contains("add it to the Service's ports")),
        "{:#?}",
        e.remedy
    );
}

/// A running fake API server and its kubeconfig; both go on drop (the server first).
pub struct KubeFixture {
    server: FakeApiServer,
    kubeconfig: String,
    dir: TempDir,
}

impl KubeFixture {
    /// The lab's objects, in the lab's node.
    pub fn builder() -> Builder {
        Builder {
            objects: fixtures::lab(),
            listen: Listen::Node,
            tag: "kubeconfig".to_owned(),
        }
    }

    /// `builder().start()`.
    pub fn lab() -> Self {
        Self::builder().start()
    }

    /// No objects, on 127.0.0.1 of the test's own namespace: for the kubectl plugin's tests,
    /// which need no lab.
    pub fn bare(tag: &str) -> Self {
        Self::builder()
            .objects(vec![])
            .listen(Listen::Host)
            .tag(tag)
            .start()
    }

    /// The kubeconfig pointing at the server (127.0.0.1).
    pub fn kubeconfig(&self) -> &str {
        &self.kubeconfig
    }

    /// A second kubeconfig, for a client that reaches the server at `host` (with
    /// [`Listen::NodeForAll`]).
    pub fn kubeconfig_via(&self, host: IpAddr) -> PathBuf {
        let path = self.dir.path().join(format!("kubeconfig-{host}"));
        self.server
            .write_kubeconfig_via(&path, host)
            .expect("kubeconfig");
        path
    }

    /// The scratch directory (removed on drop), for a test's other files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// [`Agent::start`] in the lab's node with `--nic`, this kubeconfig and the node's name,
    /// then `extra`.
    pub fn start_agent(&self, extra: &[&str]) -> Agent {
        self.start_agent_with_env(extra, &[])
    }

    /// [`start_agent`](Self::start_agent) with extra environment variables (the agent's test
    /// hooks).
    pub fn start_agent_with_env(&self, extra: &[&str], env: &[(&str, &str)]) -> Agent {
        self.start_agent_as(NODE_NAME, extra, env)
    }

    /// [`start_agent_with_env`](Self::start_agent_with_env) told that its node is `node` (an
    /// agent given another node's name).
    pub fn start_agent_as(&self, node: &str, extra: &[&str], env: &[(&str, &str)]) -> Agent {
        let mut args = vec![
            "--nic",
            lab::NODE_NIC,
            "--kubeconfig",
            self.kubeconfig(),
            "--node-name",
            node,
        ];
        args.extend_from_slice(extra);
        Agent::start_with_env(lab::NS_NODE, &args, env)
    }
}

impl KubeFixture {
    /// `kubectl-clb_probe --kubeconfig <this> ARGS` in the test's namespace (with
    /// [`Listen::Host`]), `KUBECONFIG` unset.
    pub fn run(&self, args: &[&str]) -> Output {
        self.run_env(args, &[])
    }

    /// [`run`](Self::run) with `words` split at white space: `a.run_words("fix -n shop web")`.
    pub fn run_words(&self, words: &str) -> Output {
        self.run(&words.split_whitespace().collect::<Vec<_>>())
    }

    /// [`run`](Self::run) with extra environment variables.
    pub fn run_env(&self, args: &[&str], env: &[(&str, &OsStr)]) -> Output {
        Command::new(plugin_bin())
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(args)
            .env_remove("KUBECONFIG")
            .envs(env.iter().copied())
            .output()
            .expect("run kubectl-clb_probe")
    }
}

impl KubeFixture {
    /// The `externalTrafficPolicy` stored on the Service named `name`; panics when there is
    /// no such Service or it has none.
    pub fn stored_etp(&self, name: &str) -> String {
        self.objects("Service")
            .iter()
            .find(|s| s["metadata"]["name"] == name)
            .and_then(|s| {
                s["spec"]["externalTrafficPolicy"]
                    .as_str()
                    .map(String::from)
            })
            .unwrap_or_else(|| panic!("no Service {name} with an externalTrafficPolicy"))
    }
}

/// A Node whose `spec.providerID` is `provider_id` (which names the cloud provider).
pub fn node_object(name: &str, provider_id: &str) -> Value {
    serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
           "spec": {"providerID": provider_id}})
}

impl Deref for KubeFixture {
    type Target = FakeApiServer;

    fn deref(&self) -> &FakeApiServer {
        &self.server
    }
}
