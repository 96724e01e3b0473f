//! tonic adapter for CRI v1 `ImageService`: each method unpacks the request, calls the image
//! operation in `crate::images` through [`instrument::run`], and packs the result.

use crate::cri::error::CriError;
use crate::cri::instrument::{self, Ids};
use crate::cri::v1;
use crate::cri::v1::image_service_server::ImageService;
use crate::images::registry::auth::Credentials;
use crate::images::store::ImageInfo;
use crate::images::{image_fs_info, image_pull, image_remove, image_status};
use tonic::{Request, Response, Status};

use super::{batch_stream, BatchStream, CriService};

impl CriService {
    /// ListImages' and StreamImages' items.
    fn images(&self, filter: Option<&str>) -> Vec<v1::Image> {
        image_status::list_images(&self.rt.images, filter)
            .into_iter()
            .map(image_to_pb)
            .collect()
    }
}

fn image_to_pb(i: ImageInfo) -> v1::Image {
    let (uid, username) = i.user_ids();
    v1::Image {
        id: i.id.clone(),
        repo_tags: i.repo_tags.into_iter().collect(),
        repo_digests: i.repo_digests.into_iter().collect(),
        size: i.size,
        uid: uid.map(|value| v1::Int64Value { value }),
        username,
        spec: Some(v1::ImageSpec {
            image: i.id,
            ..Default::default()
        }),
        pinned: i.pinned,
    }
}

fn image_name(spec: &Option<v1::ImageSpec>) -> String {
    spec.as_ref().map(|s| s.image.clone()).unwrap_or_default()
}

fn credentials(auth: Option<v1::AuthConfig>) -> Credentials {
    match auth {
        None => Credentials::anonymous(),
        Some(a) => Credentials {
            username: a.username,
            password: a.password,
            auth: a.auth,
            identity_token: a.identity_token,
            registry_token: a.registry_token,
        },
    }
}

/// PullImage refuses an empty reference as an invalid request, before the pull.
fn require_image(image: &str) -> Result<(), CriError> {
    if image.trim().is_empty() {
        return Err(CriError::InvalidArgument {
            what: "image.image",
            reason: "the image reference is empty".into(),
        });
    }
    Ok(())
}

#[tonic::async_trait]
impl ImageService for CriService {
    async fn list_images(
        &self,
        request: Request<v1::ListImagesRequest>,
    ) -> Result<Response<v1::ListImagesResponse>, Status> {
        let filter = request
            .into_inner()
            .filter
            .and_then(|f| f.image)
            .map(|s| s.image);
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "ListImages",
            Ids::none(),
            |_log| async move {
                Ok(v1::ListImagesResponse {
                    images: self.images(filter.as_deref()),
                })
            },
        )
        .await
    }

    async fn image_status(
        &self,
        request: Request<v1::ImageStatusRequest>,
    ) -> Result<Response<v1::ImageStatusResponse>, Status> {
        let req = request.into_inner();
        let image = image_name(&req.image);
        let ids = Ids {
            image: Some(image.clone()),
            ..Ids::none()
        };
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "ImageStatus",
            ids,
            |_log| async move {
                let found = image_status::image_status(&self.rt.images, &image);
                let mut info = std::collections::HashMap::new();
                if req.verbose {
                    if let Some(i) = &found {
                        info.insert("info".to_string(), image_status::verbose_info(i));
                    }
                }
                Ok(v1::ImageStatusResponse {
                    image: found.map(image_to_pb),
                    info,
                })
            },
        )
        .await
    }

    async fn pull_image(
        &self,
        request: Request<v1::PullImageRequest>,
    ) -> Result<Response<v1::PullImageResponse>, Status> {
        let req = request.into_inner();
        let image = image_name(&req.image);
        let server_address = req
            .auth
            .as_ref()
            .map(|a| a.server_address.clone())
            .unwrap_or_default();
        let creds = credentials(req.auth);
        let ids = Ids {
            image: Some(image.clone()),
            ..Ids::none()
        };
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "PullImage",
            ids,
            |_log| async move {
                // A caller's deadline is cri::deadline's (DEADLINE_EXCEEDED, for every RPC).
                require_image(&image)?;
                let image_ref = image_pull::pull_image(
                    &self.rt.images,
                    &image,
                    creds,
                    &server_address,
                    &self.rt.log,
                )
                .await?;
                Ok(v1::PullImageResponse { image_ref })
            },
        )
        .await
    }

    async fn remove_image(
        &self,
        request: Request<v1::RemoveImageRequest>,
    ) -> Result<Response<v1::RemoveImageResponse>, Status> {
        let image = image_name(&request.into_inner().image);
        let ids = Ids {
            image: Some(image.clone()),
            ..Ids::none()
        };
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "RemoveImage",
            ids,
            |log| async move {
                image_remove::remove_image(&self.rt.images, &image, &log).await?;
                Ok(v1::RemoveImageResponse {})
            },
        )
        .await
    }

    async fn image_fs_info(
        &self,
        _request: Request<v1::ImageFsInfoRequest>,
    ) -> Result<Response<v1::ImageFsInfoResponse>, Status> {
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "ImageFsInfo",
            Ids::none(),
            |_log| async move {
                let u = image_fs_info::image_fs_info(self.rt.pods.snapshot_usage()).await?;
                let usage = v1::FilesystemUsage {
                    timestamp: u.timestamp_ns,
                    fs_id: Some(v1::FilesystemIdentifier {
                        mountpoint: u.mountpoint.display().to_string(),
                    }),
                    used_bytes: Some(v1::UInt64Value {
                        value: u.used_bytes,
                    }),
                    inodes_used: Some(v1::UInt64Value {
                        value: u.inodes_used,
                    }),
                };
                Ok(v1::ImageFsInfoResponse {
                    image_filesystems: vec![usage],
                    container_filesystems: vec![],
                })
            },
        )
        .await
    }

    type StreamImagesStream = BatchStream<v1::StreamImagesResponse>;

    async fn stream_images(
        &self,
        request: Request<v1::StreamImagesRequest>,
    ) -> Result<Response<Self::StreamImagesStream>, Status> {
        let filter = request
            .into_inner()
            .filter
            .and_then(|f| f.image)
            .map(|s| s.image);
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "StreamImages",
            Ids::none(),
            |_log| async move {
                Ok(batch_stream(self.images(filter.as_deref()), |images| {
                    v1::StreamImagesResponse { images }
                }))
            },
        )
        .await
    }
}
