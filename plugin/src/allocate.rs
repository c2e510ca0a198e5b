//! Realizing one container's reservation (TODO: being written).

use std::sync::Arc;

use crate::api::deviceplugin::v1beta1::{AllocateRequest, AllocateResponse};
use crate::run::NodeContext;

/// Serves kubelet's Allocate.
#[derive(Debug)]
pub struct Allocator {
    ctx: Arc<NodeContext>,
}

impl Allocator {
    /// An allocator for the node.
    pub fn new(ctx: Arc<NodeContext>) -> Allocator {
        Allocator { ctx }
    }

    /// Kubelet's Allocate: one answer per container request.
    pub async fn allocate(
        &self,
        request: AllocateRequest,
    ) -> Result<AllocateResponse, tonic::Status> {
        let _ = (&self.ctx, request);
        Err(tonic::Status::unimplemented("Allocate is being written"))
    }
}
