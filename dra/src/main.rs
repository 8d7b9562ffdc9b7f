//! `cuslice-dra-plugin`: the kubelet plugin of cuslice's DRA driver (see
//! the crate documentation and docs/kubernetes.md). Runs on each GPU node
//! as root, beside the kubelet.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use cuslice_dra::{api, claim, cleanup, gpus, node, publish, server};
use cuslice_host::gpu::health::source as health;

#[derive(Parser)]
#[command(
    version,
    about = "cuslice's DRA kubelet plugin: GPU memory and GPU time as consumable capacity"
)]
struct Args {
    /// The DRA driver name (of its ResourceSlices, DeviceClass and allocations).
    #[arg(long, default_value = cuslice_dra::DEFAULT_DRIVER)]
    driver_name: String,
    /// This node's name: the pool its GPUs are published in.
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// The kubelet's plugin registration directory.
    #[arg(long, default_value = "/var/lib/kubelet/plugins_registry")]
    registry_dir: PathBuf,
    /// This plugin's directory (its DRA socket and checkpoint); default
    /// /var/lib/kubelet/plugins/<driver name>.
    #[arg(long)]
    plugin_dir: Option<PathBuf>,
    /// Where the per-claim CDI specs go.
    #[arg(long, default_value = "/var/run/cdi")]
    cdi_dir: PathBuf,
    /// The OCI hook's --root (claims' quota files and segments go under
    /// <root>/claims).
    #[arg(long, default_value = "/run/cuslice")]
    root: PathBuf,
    /// The cuslice command the CDI specs' hooks run.
    #[arg(long, default_value = "/usr/bin/cuslice")]
    cuslice: PathBuf,
    /// The hooks' --lib, where not /usr/lib/cuslice/libcuslice.so.
    #[arg(long)]
    lib: Option<PathBuf>,
    /// Take the node's GPUs from this JSON file (a list of {index, uuid,
    /// memory, minor, product, compute_capability ("9.0")}) instead of
    /// NVML.
    #[arg(long)]
    gpus_file: Option<PathBuf>,
    /// Seconds between two checks of the prepared claims against the API
    /// server (also one at start): a claim it no longer has (or has under
    /// another UID, or no longer allocated here) is unprepared.
    #[arg(long, default_value_t = cleanup::PERIOD.as_secs(), value_parser = clap::value_parser!(u64).range(1..=86400))]
    cleanup_interval: u64,
    /// GPU health (docs/kubernetes.md): how long the health source waits
    /// for an XID event before asking each GPU whether it is alive (100ms
    /// to 60s).
    #[arg(long, default_value = "5s")]
    health_poll: String,
    /// How often it checks each GPU's memory (100ms to 1h).
    #[arg(long, default_value = "30s")]
    health_check: String,
    /// How long nothing must be seen before an unhealthy GPU's taint is
    /// lifted (1s to 7d); `cuslice health clear GPU` lifts it at once.
    #[arg(long, default_value = "300s")]
    health_quiet: String,
    /// Run no GPU health source: no GPU is ever tainted.
    #[arg(long)]
    no_gpu_health: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

/// Without a command: serve the kubelet (register, prepare, unprepare,
/// publish the node's ResourceSlice).
#[derive(clap::Subcommand)]
enum Command {
    /// Prepare one allocated ResourceClaim read from a file (JSON, as `kubectl
    /// get resourceclaim -o json` prints it) without a kubelet or an API
    /// server, exactly as the kubelet's NodePrepareResources would: its
    /// quota file, segment directory and CDI spec; prints the CDI device.
    /// For trying a claim on a node, and for running one by hand.
    Prepare {
        /// The ResourceClaim (JSON).
        #[arg(long)]
        claim: PathBuf,
    },
    /// Undo `prepare` (or the kubelet's prepare) of the claim with this UID.
    Unprepare {
        #[arg(long)]
        uid: String,
    },
}

fn main() -> ExitCode {
    let a = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cuslice-dra-plugin: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(a)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cuslice-dra-plugin: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `prepare` / `unprepare` of one claim, by hand.
fn by_hand(node: &node::Node, inventory: &dyn gpus::Inventory, cmd: Command) -> Result<(), String> {
    match cmd {
        Command::Prepare { claim } => {
            let text =
                std::fs::read_to_string(&claim).map_err(|e| format!("{}: {e}", claim.display()))?;
            let rc: k8s_openapi::api::resource::v1::ResourceClaim = serde_json::from_str(&text)
                .map_err(|e| format!("{}: not a ResourceClaim: {e}", claim.display()))?;
            let m = &rc.metadata;
            let want = claim::ClaimRef {
                namespace: m.namespace.clone().unwrap_or_else(|| "default".into()),
                name: m.name.clone().unwrap_or_default(),
                uid: m.uid.clone().unwrap_or_default(),
            };
            node::check_uid(&want.uid).map_err(|e| format!("{}: {e}", claim.display()))?;
            let alloc = api::allocation(&rc, &want)?;
            let devices = node.prepare_by_hand(&want, &alloc, &inventory.gpus()?)?;
            for d in devices {
                for id in d.cdi_device_ids {
                    println!("{id}");
                }
            }
            Ok(())
        }
        Command::Unprepare { uid } => node.unprepare(&uid),
    }
}

async fn run(a: Args) -> Result<(), String> {
    let node_name = a.node_name.clone();
    let plugin_dir = a
        .plugin_dir
        .unwrap_or_else(|| PathBuf::from("/var/lib/kubelet/plugins").join(&a.driver_name));
    let from_file = a.gpus_file.is_some();
    let inventory: Arc<dyn gpus::Inventory> = match a.gpus_file {
        Some(f) => Arc::new(gpus::File(f)),
        None => Arc::new(gpus::Nvml::default()),
    };
    // Said at start, not at the first claim.
    let found = inventory.gpus()?;
    eprintln!(
        "cuslice-dra-plugin: {} GPU(s): {}",
        found.len(),
        found
            .iter()
            .map(|g| format!("{} {}", g.device_name(), g.uuid))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let node = node::Node::open(node::Config {
        driver: claim::Driver {
            name: a.driver_name.clone(),
            pool: node_name.clone(),
        },
        root: a.root.clone(),
        cdi_dir: a.cdi_dir,
        state_dir: plugin_dir.clone(),
        cuslice: a.cuslice,
        lib: a.lib,
        lock_wait: node::LOCK_WAIT,
    })?;
    if let Some(cmd) = a.command {
        return by_hand(&node, inventory.as_ref(), cmd);
    }
    let client = kube::Client::try_default()
        .await
        .map_err(|e| format!("cannot reach the API server: {e}"))?;
    // GPU health: a thread asleep in NVML's event wait; a change wakes the
    // publisher at once.
    let wake = Arc::new(tokio::sync::Notify::new());
    let health = if a.no_gpu_health {
        eprintln!(
            "cuslice-dra-plugin: GPU health is off (--no-gpu-health): no GPU is ever tainted"
        );
        None
    } else {
        let cfg = health::Config {
            root: a.root.clone(),
            writer: "cuslice-dra-plugin".into(),
            poll: health::parse_duration(&a.health_poll, health::POLL_BOUNDS)
                .map_err(|e| format!("--health-poll: {e}"))?,
            check: health::parse_duration(&a.health_check, health::CHECK_BOUNDS)
                .map_err(|e| format!("--health-check: {e}"))?,
            quiet: health::parse_duration(&a.health_quiet, health::QUIET_BOUNDS)
                .map_err(|e| format!("--health-quiet: {e}"))?,
        };
        let w = wake.clone();
        let started = health::Source::start(
            cfg,
            Box::new(move |r| match r {
                health::Report::Change(c) => {
                    eprintln!("cuslice-dra-plugin: health: {}", c.line());
                    w.notify_one();
                }
                health::Report::Note(n) => eprintln!("cuslice-dra-plugin: health: {n}"),
            }),
        );
        match started {
            Ok(s) => Some(Arc::new(s) as Arc<dyn publish::HealthSource>),
            // GPUs from a file need not be NVML's: said, and on without.
            Err(e) if from_file => {
                eprintln!(
                    "cuslice-dra-plugin: GPU health is not watched ({e}): no GPU of --gpus-file is ever tainted"
                );
                None
            }
            Err(e) => return Err(format!("GPU health: {e}")),
        }
    };
    // The node's ResourceSlice: published now and kept current while the
    // plugin runs (dropped with the runtime at exit; the slice stays).
    tokio::spawn(publish::keep_published(
        Arc::new(publish::Kube(client.clone())),
        inventory.clone(),
        a.driver_name.clone(),
        node_name,
        publish::REFRESH,
        health,
        wake,
    ));
    // Claims the kubelet never unprepared, whose ResourceClaim is gone:
    // checked now and then every --cleanup-interval.
    let node = Arc::new(node);
    let claims: Arc<dyn api::ClaimSource> = Arc::new(api::Kube(client));
    tokio::spawn(cleanup::keep_clean(
        node.clone(),
        claims.clone(),
        std::time::Duration::from_secs(a.cleanup_interval),
    ));
    let (status, _) = tokio::sync::watch::channel(None);
    let registration = server::Registration {
        driver: a.driver_name.clone(),
        endpoint: plugin_dir.join("dra.sock"),
        status,
    };
    let plugin = server::Plugin {
        node,
        claims,
        gpus: inventory,
    };
    let stop = async {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    let reg_socket = a.registry_dir.join(format!("{}-reg.sock", a.driver_name));
    server::serve(registration, &reg_socket, plugin, stop).await
}
