//! The assignments of devices to containers and their checkpoint file,
//! `device-plugins/kubelet_internal_checkpoint`, shaped like kubelet's: JSON
//! `{"Data": {"PodDeviceEntries": [...], "RegisteredDevices": {...}}, "Checksum": n}`
//! where each entry holds the Allocate response as base64 protobuf, so that a
//! container restarted after a kubelet restart gets the very same response.
//! The checksum (FNV-1a 64 over the serialized `Data`) tells a torn or
//! hand-edited file from a good one.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use prost::Message;
use serde::{Deserialize, Serialize};
use tessera_kube_proto::deviceplugin::v1beta1 as api;

use super::PodRef;

/// The checkpoint's file name inside the device-plugins dir.
pub(crate) const CHECKPOINT_FILE: &str = "kubelet_internal_checkpoint";

/// The name of the thread that writes the checkpoint.
pub(crate) const WRITER_THREAD: &str = "device-checkpoint";

/// NUMA node key for devices without topology, as kubelet writes it.
pub(crate) const NO_NUMA: i64 = -1;

/// Devices of one (pod, container, resource) and the plugin's answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Assignment {
    /// The pod.
    pub pod: PodRef,
    /// Device ids by NUMA node ([`NO_NUMA`] for devices without topology).
    pub devices_by_numa: BTreeMap<i64, Vec<String>>,
    /// The Allocate response for this container.
    pub response: api::ContainerAllocateResponse,
}

impl Assignment {
    /// Every device id, once each, sorted.
    pub fn device_ids(&self) -> BTreeSet<String> {
        self.devices_by_numa.values().flatten().cloned().collect()
    }
}

/// Key of an assignment: pod uid, container name, resource name.
pub(crate) type AssignmentKey = (String, String, String);

/// What the checkpoint holds, in memory.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Ledger {
    /// Every assignment of an active pod.
    pub assignments: BTreeMap<AssignmentKey, Assignment>,
    /// Every resource a plugin registered, with its healthy device ids at
    /// the last change (kubelet restores the names after a restart).
    pub registered: BTreeMap<String, Vec<String>>,
}

impl Ledger {
    /// Device ids of `resource` held by any container.
    pub fn assigned(&self, resource: &str) -> BTreeSet<String> {
        self.assignments
            .iter()
            .filter(|((_, _, r), _)| r == resource)
            .flat_map(|(_, a)| a.device_ids())
            .collect()
    }
}

/// What can go wrong with the checkpoint file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CheckpointError {
    /// Reading or writing the file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The file does not parse, or a field is wrong.
    #[error("{path}: corrupt checkpoint: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

#[derive(Serialize, Deserialize)]
struct FileForm {
    #[serde(rename = "Data")]
    data: DataForm,
    #[serde(rename = "Checksum")]
    checksum: u64,
}

#[derive(Serialize, Deserialize, Default)]
struct DataForm {
    #[serde(rename = "PodDeviceEntries", default)]
    pod_device_entries: Vec<EntryForm>,
    #[serde(rename = "RegisteredDevices", default)]
    registered_devices: BTreeMap<String, Vec<String>>,
}

#[derive(Serialize, Deserialize)]
struct EntryForm {
    #[serde(rename = "PodUID")]
    pod_uid: String,
    #[serde(rename = "PodNamespace")]
    pod_namespace: String,
    #[serde(rename = "PodName")]
    pod_name: String,
    #[serde(rename = "ContainerName")]
    container_name: String,
    #[serde(rename = "ResourceName")]
    resource_name: String,
    #[serde(rename = "DeviceIDs")]
    device_ids: BTreeMap<i64, Vec<String>>,
    #[serde(rename = "AllocResp")]
    alloc_resp: String,
}

/// Every checkpoint write of the unit tests: the file, the writing thread.
#[cfg(test)]
pub(crate) static WRITES: std::sync::Mutex<Vec<(PathBuf, Option<String>)>> =
    std::sync::Mutex::new(Vec::new());

/// Writes `ledger` to `path` atomically (temp file in the same dir, fsync,
/// rename), so a crash leaves the old checkpoint or the new one.
pub(crate) fn write(path: &Path, ledger: &Ledger) -> Result<(), CheckpointError> {
    #[cfg(test)]
    WRITES.lock().unwrap_or_else(|e| e.into_inner()).push((
        path.to_owned(),
        std::thread::current().name().map(str::to_owned),
    ));
    let data = DataForm {
        pod_device_entries: ledger
            .assignments
            .iter()
            .map(|((uid, container, resource), a)| EntryForm {
                pod_uid: uid.clone(),
                pod_namespace: a.pod.namespace.clone(),
                pod_name: a.pod.name.clone(),
                container_name: container.clone(),
                resource_name: resource.clone(),
                device_ids: a.devices_by_numa.clone(),
                alloc_resp: base64_encode(&a.response.encode_to_vec()),
            })
            .collect(),
        registered_devices: ledger.registered.clone(),
    };
    let checksum = checksum_of(&data);
    let text =
        serde_json::to_vec(&FileForm { data, checksum }).map_err(|e| CheckpointError::Corrupt {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    let io = |source| CheckpointError::Io {
        path: path.to_owned(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp).map_err(io)?;
    file.write_all(&text).map_err(io)?;
    file.sync_all().map_err(io)?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(io)
}

/// What the writer thread is asked to do: write `ledger`, and tell `done`
/// (when given) how that went.
struct Job {
    ledger: Ledger,
    done: Option<tokio::sync::oneshot::Sender<Result<(), String>>>,
}

/// Writes checkpoint snapshots on its own thread, so that no fsync runs on
/// an async worker or under the manager's locks. Snapshots are written in
/// the order they are sent; when several wait, only the newest is written
/// (it contains what the older ones did), and each waiter hears the result.
pub(crate) struct Writer {
    jobs: std::sync::Mutex<Option<std::sync::mpsc::Sender<Job>>>,
    thread: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Writer {
    /// Starts the writer thread for the checkpoint at `path`.
    pub fn start(path: PathBuf) -> Result<Writer, std::io::Error> {
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name(WRITER_THREAD.into())
            .spawn(move || {
                while let Ok(first) = queue.recv() {
                    let mut ledger = first.ledger;
                    let mut waiting: Vec<_> = first.done.into_iter().collect();
                    while let Ok(next) = queue.try_recv() {
                        ledger = next.ledger;
                        waiting.extend(next.done);
                    }
                    let result = write(&path, &ledger).map_err(|e| e.to_string());
                    if let Err(e) = &result {
                        // The in-memory state stays right; the next write
                        // retries.
                        tracing::error!("{e}");
                    }
                    for done in waiting {
                        let _ = done.send(result.clone());
                    }
                }
            })?;
        Ok(Writer {
            jobs: std::sync::Mutex::new(Some(jobs)),
            thread: std::sync::Mutex::new(Some(thread)),
        })
    }

    fn send(
        &self,
        ledger: &Ledger,
        done: Option<tokio::sync::oneshot::Sender<Result<(), String>>>,
    ) {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(jobs) = jobs.as_ref() {
            let _ = jobs.send(Job {
                ledger: ledger.clone(),
                done,
            });
        }
    }

    /// Queues `ledger` for writing. Call with the ledger locked, so that
    /// snapshots queue in the order of the changes.
    pub fn save(&self, ledger: &Ledger) {
        self.send(ledger, None);
    }

    /// Queues `ledger` for writing; the result comes when it is on disk.
    /// Call with the ledger locked, await with it unlocked.
    pub fn save_and_wait(
        &self,
        ledger: &Ledger,
    ) -> impl Future<Output = Result<(), String>> + use<> {
        let (done, written) = tokio::sync::oneshot::channel();
        self.send(ledger, Some(done));
        async move {
            written
                .await
                .unwrap_or_else(|_| Err("the checkpoint writer has stopped".to_owned()))
        }
    }

    /// Waits until everything queued so far is on disk, then takes no more
    /// (a later manager on the same dir must not see a stale write land).
    pub async fn close(&self) {
        // Without a sender the thread writes what is queued and ends.
        drop(self.jobs.lock().unwrap_or_else(|e| e.into_inner()).take());
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = thread {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

/// Reads the checkpoint at `path`; `Ok(None)` when there is none.
pub(crate) fn read(path: &Path) -> Result<Option<Ledger>, CheckpointError> {
    let text = match std::fs::read(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(CheckpointError::Io {
                path: path.to_owned(),
                source,
            });
        }
    };
    let corrupt = |reason: String| CheckpointError::Corrupt {
        path: path.to_owned(),
        reason,
    };
    let file: FileForm = serde_json::from_slice(&text).map_err(|e| corrupt(e.to_string()))?;
    let expected = checksum_of(&file.data);
    if file.checksum != expected {
        return Err(corrupt(format!(
            "Checksum is {}, the data's is {expected}",
            file.checksum
        )));
    }
    let mut ledger = Ledger {
        registered: file.data.registered_devices,
        ..Ledger::default()
    };
    for (i, e) in file.data.pod_device_entries.into_iter().enumerate() {
        let bytes = base64_decode(&e.alloc_resp)
            .ok_or_else(|| corrupt(format!("PodDeviceEntries[{i}].AllocResp: not base64")))?;
        let response = api::ContainerAllocateResponse::decode(bytes.as_slice())
            .map_err(|err| corrupt(format!("PodDeviceEntries[{i}].AllocResp: {err}")))?;
        let pod = PodRef {
            uid: e.pod_uid,
            namespace: e.pod_namespace,
            name: e.pod_name,
        };
        ledger.assignments.insert(
            (pod.uid.clone(), e.container_name, e.resource_name),
            Assignment {
                pod,
                devices_by_numa: e.device_ids,
                response,
            },
        );
    }
    Ok(Some(ledger))
}

/// Moves a corrupt checkpoint aside (`<file>.corrupt-<unix seconds>`) so it
/// can be looked at and the next write does not destroy it.
pub(crate) fn set_aside(path: &Path) -> std::io::Result<PathBuf> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    // Never overwrite an earlier bad file set aside in the same second.
    let mut attempt = 0u32;
    loop {
        let mut name = path.as_os_str().to_owned();
        name.push(format!(".corrupt-{secs}"));
        if attempt > 0 {
            name.push(format!("-{attempt}"));
        }
        let aside = PathBuf::from(name);
        if !aside.exists() {
            std::fs::rename(path, &aside)?;
            return Ok(aside);
        }
        attempt += 1;
    }
}

fn checksum_of(data: &DataForm) -> u64 {
    // Serializing our own struct is deterministic (ordered maps, fixed field
    // order), so the writer and the reader hash the same bytes.
    let bytes = serde_json::to_vec(data).unwrap_or_default();
    fnv1a64(&bytes)
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding (Go's `[]byte` JSON form).
fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(BASE64[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let text = text.as_bytes();
    if !text.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    for (index, chunk) in text.chunks(4).enumerate() {
        let last = index == text.len() / 4 - 1;
        let pad = chunk.iter().rev().take_while(|c| **c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n: u32 = 0;
        for c in &chunk[..4 - pad] {
            let v = BASE64.iter().position(|x| x == c)?;
            n = (n << 6) | v as u32;
        }
        n <<= 6 * pad as u32;
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_rfc_4648_vectors() {
        // RFC 4648 section 10.
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64_encode(plain.as_bytes()), coded, "encode {plain:?}");
            assert_eq!(
                base64_decode(coded).as_deref(),
                Some(plain.as_bytes()),
                "decode {coded:?}"
            );
        }
        assert_eq!(base64_decode("Zm9v!A=="), None);
        assert_eq!(base64_decode("Zg==Zg=="), None);
        assert_eq!(base64_decode("Zm9"), None);
    }

    #[test]
    fn fnv1a64_matches_the_published_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    fn sample() -> Ledger {
        let mut ledger = Ledger::default();
        let pod = PodRef {
            uid: "uid-1".into(),
            namespace: "default".into(),
            name: "p".into(),
        };
        let response = api::ContainerAllocateResponse {
            envs: [("A".to_owned(), "1".to_owned())].into(),
            cdi_devices: vec![api::CdiDevice {
                name: "example.com/dev=d0".into(),
            }],
            ..Default::default()
        };
        ledger.assignments.insert(
            ("uid-1".into(), "c".into(), "example.com/dev".into()),
            Assignment {
                pod,
                devices_by_numa: [(NO_NUMA, vec!["d0".to_owned()]), (1, vec!["d3".to_owned()])]
                    .into(),
                response,
            },
        );
        ledger
            .registered
            .insert("example.com/dev".into(), vec!["d0".into(), "d3".into()]);
        ledger
    }

    #[test]
    fn checkpoint_round_trips() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(CHECKPOINT_FILE);
        assert!(read(&path).expect("absent is fine").is_none());
        let ledger = sample();
        write(&path, &ledger).expect("write");
        assert_eq!(read(&path).expect("read"), Some(ledger));
        let text = std::fs::read_to_string(&path).expect("text");
        assert!(
            text.contains(r#""DeviceIDs":{"-1":["d0"],"1":["d3"]}"#),
            "{text}"
        );
    }

    #[test]
    fn a_changed_byte_is_caught_by_the_checksum() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(CHECKPOINT_FILE);
        write(&path, &sample()).expect("write");
        let text = std::fs::read_to_string(&path).expect("text");
        std::fs::write(&path, text.replace("\"d0\"", "\"d1\"")).expect("edit");
        let err = read(&path).expect_err("edited file must not pass");
        assert!(err.to_string().contains("Checksum"), "{err}");
        std::fs::write(&path, "{not json").expect("garbage");
        assert!(matches!(read(&path), Err(CheckpointError::Corrupt { .. })));
    }
}
