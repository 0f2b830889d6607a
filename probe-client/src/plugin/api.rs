//! The plugin's API calls: a client configured as kubectl would be, Events and agent pods.

use std::collections::BTreeMap;

use anyhow::Context as _;
use k8s_openapi::api::{
    core::v1::{Node, Pod, Service},
    events::v1::Event,
};
use kube::{
    Api, Client, Config,
    api::{DynamicObject, ListParams, Patch, PatchParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use probe_contract::{
    kube_event::REPORTING_CONTROLLER,
    verify::{NodeVerification, VerificationSpec, VerificationStatus},
};

use super::{AGENT_LABEL, KubeArgs};

/// Page size of the cluster-wide lists (the API server's own pagination).
const PAGE: u32 = 500;

/// A client as kubectl's would be: `--kubeconfig` (else `$KUBECONFIG`, else `~/.kube/config`,
/// else the in-cluster service account), `--context` (else the current context).
pub async fn client(args: &KubeArgs) -> anyhow::Result<Client> {
    let opts = KubeConfigOptions {
        context: args.context.clone(),
        ..Default::default()
    };
    let config = match (&args.kubeconfig, &args.context) {
        (Some(path), _) => {
            let kc = Kubeconfig::read_from(path).with_context(|| format!("--kubeconfig {path}"))?;
            Config::from_custom_kubeconfig(kc, &opts)
                .await
                .with_context(|| format!("--kubeconfig {path}"))?
        }
        (None, Some(_)) => Config::from_kubeconfig(&opts)
            .await
            .context("loading the kubeconfig")?,
        (None, None) => Config::infer()
            .await
            .context("no kubeconfig ($KUBECONFIG, ~/.kube/config) and not in a cluster")?,
    };
    Client::try_from(without_retries(config)).context("building the API client")
}

/// No client-side retries: kube's default retries a 503 up to 15 times with a backoff that
/// grows to minutes (kube-client 5's `RetryPolicy::server_retry`), and the API server's 503
/// for a pod it cannot reach (`pods/proxy`: an agent down) is not transient. A command someone
/// waits for at the terminal says so at once and names the node instead.
fn without_retries(mut config: Config) -> Config {
    config.default_retry = false;
    config
}

/// The one line for an API failure: a denied verb says which permission is missing.
pub fn explain(e: kube::Error, what: &str) -> anyhow::Error {
    match e {
        kube::Error::Api(status) if status.code == 403 => anyhow::anyhow!(
            "forbidden: cannot {what} ({}): ask for that permission (RBAC)",
            status.message
        ),
        kube::Error::Api(status) => {
            anyhow::anyhow!(
                "{what}: the API server answered {}: {}",
                status.code,
                status.message
            )
        }
        other => anyhow::anyhow!("{what}: {other}"),
    }
}

/// clb-probe's Events as rows (`events`): in `namespace`, else in every namespace.
///
/// Issue 36, E15: a busy cluster holds 100,000s of other controllers' Events. The API server
/// selects clb-probe's (`fieldSelector=reportingController=clb-probe`, which events.k8s.io/v1
/// maps onto the core Event's selectable `reportingComponent`), pages of [`PAGE`], and each
/// page is folded into rows before the next is read, so at most one page of Events is held
/// whatever the server sends (one that ignores the selector included).
pub async fn event_rows(
    client: Client,
    namespace: Option<&str>,
) -> anyhow::Result<Vec<super::Row>> {
    let (api, what): (Api<Event>, String) = match namespace {
        Some(ns) => (
            Api::namespaced(client, ns),
            format!("list events.k8s.io events in namespace {ns}"),
        ),
        None => (
            Api::all(client),
            "list events.k8s.io events in all namespaces".to_string(),
        ),
    };
    let fields = format!("reportingController={REPORTING_CONTROLLER}");
    agent_events(&api, &fields, &what, |ev| super::row(&ev)).await
}

/// clb-probe's Events regarding the Service `namespace/name`, from its own namespace only
/// (`fix`: the agents write a Service's Events there, E6; so `list events` in that namespace
/// is the only permission needed, E15). Selected by the API server
/// (`reportingController`, `regarding.kind`, `regarding.name`) and checked again here, page
/// by page.
pub async fn service_events(
    client: Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<Vec<Event>> {
    let api: Api<Event> = Api::namespaced(client, namespace);
    let fields = format!(
        "reportingController={REPORTING_CONTROLLER},regarding.kind=Service,regarding.name={name}"
    );
    let what = format!("list events.k8s.io events in namespace {namespace}");
    agent_events(&api, &fields, &what, |ev| {
        let regards = ev.regarding.as_ref().is_some_and(|r| {
            r.kind.as_deref() == Some("Service")
                && r.namespace.as_deref() == Some(namespace)
                && r.name.as_deref() == Some(name)
        });
        (regards && ev.reporting_controller.as_deref() == Some(REPORTING_CONTROLLER)).then_some(ev)
    })
    .await
}

/// Lists `api`'s Events matching `fields`, [`PAGE`] at a time, keeping what `keep` returns of
/// each (the rest is dropped with its page).
async fn agent_events<T>(
    api: &Api<Event>,
    fields: &str,
    what: &str,
    mut keep: impl FnMut(Event) -> Option<T>,
) -> anyhow::Result<Vec<T>> {
    let mut out = Vec::new();
    let mut params = ListParams::default().fields(fields).limit(PAGE);
    loop {
        let page = api.list(&params).await.map_err(|e| explain(e, what))?;
        out.extend(page.items.into_iter().filter_map(&mut keep));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(out),
        }
    }
}

/// The clb-probe pods on `node` in the agent's `namespace` (never other namespaces: a tenant
/// may label its pods `app.kubernetes.io/name=clb-probe`).
pub async fn agent_pods(client: Client, namespace: &str, node: &str) -> anyhow::Result<Vec<Pod>> {
    let api: Api<Pod> = Api::namespaced(client, namespace);
    let params = ListParams::default()
        .fields(&format!("spec.nodeName={node}"))
        .labels(&format!("{}={}", AGENT_LABEL.0, AGENT_LABEL.1));
    Ok(api
        .list(&params)
        .await
        .map_err(|e| explain(e, "list pods"))?
        .items)
}

/// The Service `namespace/name`.
pub async fn get_service(client: Client, namespace: &str, name: &str) -> anyhow::Result<Service> {
    Api::<Service>::namespaced(client, namespace)
        .get(name)
        .await
        .map_err(|e| explain(e, &format!("get services {name} in namespace {namespace}")))
}

/// The Nodes' `spec.providerID`s. A denied or failed list is not fatal (the provider then
/// comes from `--provider` or the Service): the reason is returned for a warning.
pub async fn node_provider_ids(client: Client) -> Result<Vec<String>, anyhow::Error> {
    let nodes = Api::<Node>::all(client)
        .list(&ListParams::default().limit(PAGE))
        .await
        .map_err(|e| explain(e, "list nodes"))?;
    Ok(nodes
        .items
        .into_iter()
        .filter_map(|n| n.spec.and_then(|s| s.provider_id))
        .collect())
}

/// A merge patch of the Service; `dry_run`: `dryRun=All` (the server validates, stores
/// nothing). A 403 or a 409 is a refusal ([`super::fix::Refused`]: exit 2).
pub async fn patch_service(
    client: Client,
    namespace: &str,
    name: &str,
    patch: &serde_json::Value,
    dry_run: bool,
) -> anyhow::Result<Service> {
    let params = PatchParams {
        dry_run,
        ..Default::default()
    };
    let what = format!(
        "patch services {name} in namespace {namespace}{}",
        if dry_run { " (dry run)" } else { "" }
    );
    Api::<Service>::namespaced(client, namespace)
        .patch(name, &params, &Patch::Merge(patch))
        .await
        .map_err(|e| match e {
            kube::Error::Api(status) if status.code == 409 => anyhow::Error::new(super::fix::Refused(format!(
                "Service {namespace}/{name} changed since the fix was computed: {}; list the fixes again",
                status.message
            ))),
            kube::Error::Api(status) if status.code == 403 => anyhow::Error::new(super::fix::Refused(format!(
                "forbidden: cannot patch services in namespace {namespace} ({}): ask for that permission (RBAC)",
                status.message
            ))),
            other => explain(other, &what),
        })
}

/// Every Node's name (paged).
pub async fn node_names(client: Client) -> anyhow::Result<Vec<String>> {
    let api: Api<Node> = Api::all(client);
    let mut out = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = api
            .list_metadata(&params)
            .await
            .map_err(|e| explain(e, "list nodes"))?;
        out.extend(page.items.into_iter().filter_map(|n| n.metadata.name));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(out),
        }
    }
}

/// Every `LoopbackReport` (paged): (object name, status). A report whose status does not
/// parse is kept with an empty status (listed as stale: no `lastUpdate`).
pub async fn node_reports(
    client: Client,
) -> anyhow::Result<Vec<(String, probe_contract::report::ReportStatus)>> {
    let api: Api<kube::api::DynamicObject> = Api::all_with(client, &crate::report::api_resource());
    let mut out = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = api.list(&params).await.map_err(|e| match e {
            kube::Error::Api(status) if status.code == 404 => anyhow::anyhow!(
                "the LoopbackReport CRD (loopbackreports.{}) is not installed: install the chart \
                 with nodeReport.enabled=true",
                probe_contract::report::GROUP
            ),
            other => explain(other, "list loopbackreports"),
        })?;
        for item in page.items {
            let Some(name) = item.metadata.name.clone() else {
                continue;
            };
            let status = item
                .data
                .get("status")
                .cloned()
                .and_then(|s| serde_json::from_value(s).ok())
                .unwrap_or_default();
            out.push((name, status));
        }
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(out),
        }
    }
}

/// `GET path` of `pod`'s `port` through the API server's pod proxy
/// (`/api/v1/namespaces/NS/pods/POD:PORT/proxy/PATH`): the body as bytes. A refusal by the API
/// server (403 without `pods/proxy`, 503 when it cannot reach the pod) or an error answer of
/// the agent is one line saying which.
pub async fn proxy_get(
    client: &Client,
    namespace: &str,
    pod: &str,
    port: u16,
    path: &str,
    headers: &[(&str, &str)],
) -> anyhow::Result<Vec<u8>> {
    let what = format!("get pods/proxy {pod}:{port}{path} in namespace {namespace}");
    let mut request = http::Request::get(format!(
        "/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy{path}"
    ));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(kube::client::Body::from(Vec::new()))
        .with_context(|| what.clone())?;
    let response = client.send(request).await.map_err(|e| explain(e, &what))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect_bytes()
        .await
        .map_err(|e| explain(e, &what))?;
    if status.is_success() {
        return Ok(body.to_vec());
    }
    // The API server's own refusal is a Status; anything else is the agent's answer.
    if let Ok(s) = serde_json::from_slice::<kube::core::Status>(&body)
        && s.code != 0
    {
        return Err(explain(kube::Error::Api(Box::new(s)), &what));
    }
    let text = String::from_utf8_lossy(&body);
    Err(anyhow::anyhow!(
        "{what}: the agent answered {}: {}",
        status.as_u16(),
        crate::term::escape(text.trim())
    ))
}

/// The API resource of `LoopbackVerification`, for `kube::Api<DynamicObject>`.
pub fn verification_resource() -> kube::core::ApiResource {
    probe_contract::verify::RESOURCE.api_resource()
}

/// The token the agents' `GET /evidence` requires (issue #49, H9): key `token` of Secret
/// `clb-probe-evidence` in the agents' namespace. Reading it needs `get` on that Secret: who
/// may read the evidence is decided by the API's RBAC, as for everything else the plugin does.
pub async fn evidence_token(client: &Client, namespace: &str) -> anyhow::Result<String> {
    use probe_contract::evidence::{TOKEN_KEY, TOKEN_MAX_BYTES, TOKEN_SECRET};
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), namespace);
    let what = format!("get secret {TOKEN_SECRET} in namespace {namespace}");
    let secret = match secrets.get(TOKEN_SECRET).await {
        Ok(s) => s,
        Err(kube::Error::Api(status)) if status.code == 404 => anyhow::bail!(
            "the agents serve no evidence: Secret {namespace}/{TOKEN_SECRET} does not exist. Create it \
             (the agents read it within a minute, no restart): kubectl -n {namespace} create secret \
             generic {TOKEN_SECRET} --from-literal={TOKEN_KEY}=\"$(head -c 32 /dev/urandom | base64 -w0)\" \
             (SECURITY.md, \"Evidence\")"
        ),
        Err(e) => return Err(explain(e, &what)),
    };
    let token = secret
        .data
        .as_ref()
        .and_then(|d| d.get(TOKEN_KEY))
        .map(|b| String::from_utf8_lossy(&b.0).trim().to_owned())
        .unwrap_or_default();
    if token.is_empty() || token.len() > TOKEN_MAX_BYTES || token.contains(['\r', '\n']) {
        anyhow::bail!(
            "Secret {namespace}/{TOKEN_SECRET} has no usable key {TOKEN_KEY} (one line, 1 to {TOKEN_MAX_BYTES} bytes)"
        );
    }
    Ok(token)
}

/// `verify`: creates one request object per node in `spec.nodes` (labelled with the node and
/// this run, issue #49 H3: each agent watches its own node's objects only), waits (listing the
/// run's objects every half second) until every node answered or `timeout` passed, deletes
/// them, and returns the answers (nodes without one in `missing`). Any exit deletes what was
/// created: an error half-way, Ctrl-C or SIGTERM.
pub async fn run_verification(
    client: Client,
    spec: &VerificationSpec,
    timeout: std::time::Duration,
) -> anyhow::Result<super::verify::Verification> {
    use probe_contract::verify::MAX_NODES;
    if spec.nodes.len() > MAX_NODES {
        anyhow::bail!(
            "{} nodes to ask; verify asks at most {MAX_NODES} at a time: name them with --node",
            spec.nodes.len()
        );
    }
    // Ctrl-C or SIGTERM from here on: the requests are deleted all the same (issue #49: an
    // interrupted verify left its request behind). The handlers are installed before the
    // first request is created, so no signal ends the plugin between the two.
    let interrupted = interruption();
    let requester = whoami(&client).await;
    let api: Api<DynamicObject> = Api::all_with(client, &verification_resource());
    let run = run_id();
    // (object name, node), in the order created: what is deleted at the end.
    let mut created: Vec<(String, String)> = Vec::new();
    let mut answers = BTreeMap::new();
    let work = async {
        for node in &spec.nodes {
            let object = request_object(spec, node, &run, &requester);
            created.push((create_request(&api, &object).await?, node.clone()));
        }
        wait_for_answers(&api, spec, &run, &created, timeout, &mut answers).await
    };
    let result = tokio::select! {
        r = work => r,
        signal = interrupted => Err(anyhow::anyhow!(
            "interrupted ({signal}): the requests of run {run} were deleted, nothing was concluded"
        )),
    };
    delete_requests(&api, &created).await;
    result?;
    let missing = spec
        .nodes
        .iter()
        .filter(|n| !super::verify::answered(answers.get(*n)))
        .cloned()
        .collect();
    Ok(super::verify::Verification {
        request: run,
        service: spec.service.key(),
        nodes: answers,
        missing,
    })
}

/// The first SIGINT or SIGTERM, by name. The handlers are installed when this is called, not
/// when the future is first polled.
fn interruption() -> impl std::future::Future<Output = &'static str> {
    use tokio::signal::unix::{Signal, SignalKind, signal};
    let mut int = signal(SignalKind::interrupt()).ok();
    let mut term = signal(SignalKind::terminate()).ok();
    async move {
        async fn next(s: &mut Option<Signal>) {
            match s.as_mut() {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        }
        tokio::select! {
            () = next(&mut int) => "SIGINT",
            () = next(&mut term) => "SIGTERM",
        }
    }
}

/// The request object for `node` alone: a generated name, labelled with the node and the
/// `run`, annotated with the `requester`.
fn request_object(
    spec: &VerificationSpec,
    node: &str,
    run: &str,
    requester: &str,
) -> DynamicObject {
    use probe_contract::verify::{
        GENERATE_NAME, NODE_LABEL, REQUESTER_ANNOTATION, RUN_LABEL, node_label_value,
    };
    let mut object = DynamicObject::new("", &verification_resource());
    object.metadata.name = None;
    object.metadata.generate_name = Some(GENERATE_NAME.to_owned());
    object.metadata.labels = Some(
        [
            (NODE_LABEL.to_owned(), node_label_value(node)),
            (RUN_LABEL.to_owned(), run.to_owned()),
        ]
        .into(),
    );
    let one = VerificationSpec {
        nodes: vec![node.to_owned()],
        ..spec.clone()
    };
    object.metadata.annotations =
        Some([(REQUESTER_ANNOTATION.to_owned(), requester.to_owned())].into());
    object.data = one.object_data();
    object
}

/// Creates `object`: its generated name.
async fn create_request(
    api: &Api<DynamicObject>,
    object: &DynamicObject,
) -> anyhow::Result<String> {
    use probe_contract::verify::{GROUP, PLURAL};
    let made = api
        .create(&kube::api::PostParams::default(), object)
        .await
        .map_err(|e| match e {
            kube::Error::Api(status) if status.code == 404 => anyhow::anyhow!(
                "the LoopbackVerification CRD ({PLURAL}.{GROUP}) is not installed: install the chart with kube.verify=true"
            ),
            other => explain(other, &format!("create {PLURAL}.{GROUP}")),
        })?;
    Ok(made.metadata.name.unwrap_or_default())
}

/// Lists the `run`'s objects every half second into `answers` until every node of `spec`
/// answered or `timeout` passed.
async fn wait_for_answers(
    api: &Api<DynamicObject>,
    spec: &VerificationSpec,
    run: &str,
    created: &[(String, String)],
    timeout: std::time::Duration,
    answers: &mut BTreeMap<String, NodeVerification>,
) -> anyhow::Result<()> {
    use probe_contract::verify::{PLURAL, RUN_LABEL};
    let deadline = tokio::time::Instant::now() + timeout;
    let params = ListParams::default().labels(&format!("{RUN_LABEL}={run}"));
    loop {
        let list = api
            .list(&params)
            .await
            .map_err(|e| explain(e, &format!("list {PLURAL} -l {RUN_LABEL}={run}")))?;
        for object in list.items {
            if let Some((node, entry)) = own_answer(&object, created) {
                answers.insert(node, entry);
            }
        }
        let all = spec
            .nodes
            .iter()
            .all(|n| super::verify::answered(answers.get(n)));
        if all || tokio::time::Instant::now() >= deadline {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// The answer in `object`, when it is one this run `created`: only its own node's entry.
fn own_answer(
    object: &DynamicObject,
    created: &[(String, String)],
) -> Option<(String, NodeVerification)> {
    let (_, node) = created
        .iter()
        .find(|(name, _)| object.metadata.name.as_deref() == Some(name))?;
    let status = VerificationStatus::of_object(&object.data);
    let entry = status.nodes.get(node)?;
    Some((node.clone(), entry.clone()))
}

/// Deletes the `created` objects whatever happened: a request left behind would be answered
/// by no one (too old) and only clutter the list. A denied delete is said, not fatal.
async fn delete_requests(api: &Api<DynamicObject>, created: &[(String, String)]) {
    use probe_contract::verify::PLURAL;
    for (name, _) in created {
        if let Err(e) = api.delete(name, &Default::default()).await {
            eprintln!(
                "kubectl clb-probe: warning: {}",
                crate::term::escape_lines(&format!(
                    "{:#}",
                    explain(e, &format!("delete {PLURAL} {name}"))
                ))
            );
        }
    }
}

/// The user the API server authenticates this plugin as (a SelfSubjectReview, GA since
/// Kubernetes 1.28): the requester the agents rate-limit by. Empty when the server cannot say
/// (older, or the review denied): the request is then unnamed, and where the chart's
/// admission policy is installed, refused by it with its message.
async fn whoami(client: &Client) -> String {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let reviews: Api<SelfSubjectReview> = Api::all(client.clone());
    reviews
        .create(
            &kube::api::PostParams::default(),
            &SelfSubjectReview::default(),
        )
        .await
        .ok()
        .and_then(|r| r.status?.user_info?.username)
        .unwrap_or_default()
}

/// A label value naming one `verify` run: the time in nanoseconds and the process id, hex
/// (unique enough: a clash only merges two runs' lists, and each keeps to its own objects).
fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("r{nanos:x}-{:x}", std::process::id())
}
