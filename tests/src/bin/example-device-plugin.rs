//! A tiny kubelet device plugin (v1beta1) for the cluster end-to-end test:
//! serves `--resource` (default `example.com/dev`) with `--devices` healthy
//! devices `dev-0`…; `Allocate` answers with the CDI device `--cdi-device`
//! (a device of the node's static `tessera.io/gpu` spec), the env
//! `EXAMPLE_DEV=<ids>` and an annotation `example.com/dev-ids=<ids>`, and
//! appends one JSON line per call to `--record`. It registers with
//! `<kubelet dir>/device-plugins/kubelet.sock` and again whenever its own
//! socket vanishes (kubelet wipes the directory when it starts).
//! Works the same against a real kubelet (run it on the node).

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use tessera_kube_proto::deviceplugin::v1beta1 as dp;
use tonic::transport::Server;
use tonic::{Request, Response, Status};

#[derive(Parser)]
struct Args {
    /// The kubelet's directory (`/var/lib/kubelet` on a real node).
    #[arg(long)]
    kubelet_dir: PathBuf,
    /// The extended resource served.
    #[arg(long, default_value = "example.com/dev")]
    resource: String,
    /// How many devices.
    #[arg(long, default_value_t = 2)]
    devices: u32,
    /// The fully qualified CDI device every allocation gets.
    #[arg(long, default_value = "tessera.io/gpu=0")]
    cdi_device: String,
    /// The socket's file name in the device-plugins directory.
    #[arg(long, default_value = "example-dev.sock")]
    socket_name: String,
    /// A file to append one JSON line per Allocate call to.
    #[arg(long)]
    record: Option<PathBuf>,
}

#[derive(Clone)]
struct Plugin {
    devices: u32,
    cdi_device: String,
    record: Option<PathBuf>,
}

type DeviceStream =
    Pin<Box<dyn futures::Stream<Item = Result<dp::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl dp::device_plugin_server::DevicePlugin for Plugin {
    type ListAndWatchStream = DeviceStream;

    async fn get_device_plugin_options(
        &self,
        _: Request<dp::Empty>,
    ) -> Result<Response<dp::DevicePluginOptions>, Status> {
        Ok(Response::new(dp::DevicePluginOptions::default()))
    }

    async fn list_and_watch(
        &self,
        _: Request<dp::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let devices = (0..self.devices)
            .map(|i| dp::Device {
                id: format!("dev-{i}"),
                health: "Healthy".into(),
                topology: None,
            })
            .collect();
        eprintln!(
            "example-device-plugin: ListAndWatch: {} devices",
            self.devices
        );
        // One list, then the stream stays open (the devices never change).
        let first = futures::stream::once(async move { Ok(dp::ListAndWatchResponse { devices }) });
        Ok(Response::new(Box::pin(futures::StreamExt::chain(
            first,
            futures::stream::pending(),
        ))))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<dp::PreferredAllocationRequest>,
    ) -> Result<Response<dp::PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented("no preferred allocation"))
    }

    async fn allocate(
        &self,
        request: Request<dp::AllocateRequest>,
    ) -> Result<Response<dp::AllocateResponse>, Status> {
        let mut responses = Vec::new();
        for container in &request.get_ref().container_requests {
            let ids = container.devices_ids.join(",");
            eprintln!("example-device-plugin: Allocate {ids}");
            if let Some(record) = &self.record {
                let line = serde_json::json!({"verb": "Allocate", "ids": container.devices_ids, "cdi": self.cdi_device});
                let appended = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(record)
                    .and_then(|mut f| writeln!(f, "{line}"));
                if let Err(e) = appended {
                    return Err(Status::internal(format!("{}: {e}", record.display())));
                }
            }
            responses.push(dp::ContainerAllocateResponse {
                envs: HashMap::from([("EXAMPLE_DEV".to_owned(), ids.clone())]),
                annotations: HashMap::from([("example.com/dev-ids".to_owned(), ids)]),
                cdi_devices: vec![dp::CdiDevice {
                    name: self.cdi_device.clone(),
                }],
                ..Default::default()
            });
        }
        Ok(Response::new(dp::AllocateResponse {
            container_responses: responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<dp::PreStartContainerRequest>,
    ) -> Result<Response<dp::PreStartContainerResponse>, Status> {
        Ok(Response::new(dp::PreStartContainerResponse {}))
    }
}

/// Serves the plugin on `socket` until the returned task is aborted.
fn serve(socket: &Path, plugin: Plugin) -> Result<tokio::task::JoinHandle<()>> {
    let _ = std::fs::remove_file(socket);
    let listener = tokio::net::UnixListener::bind(socket)
        .with_context(|| format!("binding {}", socket.display()))?;
    Ok(tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        if let Err(e) = Server::builder()
            .add_service(dp::device_plugin_server::DevicePluginServer::new(plugin))
            .serve_with_incoming(incoming)
            .await
        {
            eprintln!("example-device-plugin: server: {e}");
        }
    }))
}

async fn register(dir: &Path, args: &Args) -> Result<()> {
    let channel = tessera_e2e::unix_grpc::dial(&dir.join("kubelet.sock")).await?;
    dp::registration_client::RegistrationClient::new(channel)
        .register(dp::RegisterRequest {
            version: "v1beta1".into(),
            endpoint: args.socket_name.clone(),
            resource_name: args.resource.clone(),
            options: Some(dp::DevicePluginOptions::default()),
        })
        .await?;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = Args::parse();
    let dir = args.kubelet_dir.join("device-plugins");
    let socket = dir.join(&args.socket_name);
    let plugin = Plugin {
        devices: args.devices,
        cdi_device: args.cdi_device.clone(),
        record: args.record.clone(),
    };
    let mut server: Option<tokio::task::JoinHandle<()>> = None;
    loop {
        // (Re)start and (re)register whenever our socket is gone: at start,
        // and after kubelet wiped the directory on its own restart.
        if server.is_none() || !socket.exists() {
            if let Some(old) = server.take() {
                old.abort();
            }
            if dir.is_dir() {
                server = Some(serve(&socket, plugin.clone())?);
                // A kubelet that accepts but never answers must not hang us.
                let registered =
                    tokio::time::timeout(Duration::from_secs(10), register(&dir, &args))
                        .await
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer in 10 s")));
                match registered {
                    Ok(()) => eprintln!("example-device-plugin: registered {}", args.resource),
                    Err(e) => {
                        eprintln!("example-device-plugin: register: {e:#}; retrying");
                        if let Some(s) = server.take() {
                            s.abort();
                        }
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
