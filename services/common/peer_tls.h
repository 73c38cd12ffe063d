// Mutual TLS between Sluice's services (router, prefill, decode, encoder, kvstore): every
// service holds a certificate and key issued by the cluster's CA and trusts only that CA.
//
// A server asks every caller for a certificate and verifies it against the CA; a client
// presents its certificate and verifies the server's chain against the CA. Peers are reached at
// the addresses they advertise (pod IPs in Kubernetes), which certificates rarely name, so the
// identity checked is membership of the CA, not the host name. The files are re-read when they
// change (rotation by cert-manager), checked every few seconds by gRPC's file watcher.
#ifndef SLUICE_SERVICES_COMMON_PEER_TLS_H_
#define SLUICE_SERVICES_COMMON_PEER_TLS_H_

#include <memory>
#include <string>

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include "absl/status/status.h"

namespace grpc {
class ServerContextBase;
}

namespace sluice {

struct PeerTlsOptions {
  std::string cert_file;  // PEM certificate chain of this service (leaf first)
  std::string key_file;   // PEM private key of cert_file
  std::string ca_file;    // PEM CA certificate(s) that peers' certificates must chain to
  // Empty ca_file: mTLS is off (plaintext gRPC between services).
  bool enabled() const { return !ca_file.empty(); }
};

// ValidatePeerTls reads the files now, so that a deployment mistake stops the service at
// start-up instead of failing every handshake later. Errors (InvalidArgument, naming the file):
// a file missing or unreadable, not PEM, a key that does not match the certificate, a
// certificate that does not chain to the CA or is expired. OK when mTLS is off.
absl::Status ValidatePeerTls(const PeerTlsOptions& options);

// PeerChannelCredentials: credentials for channels to other services: present cert_file,
// verify the server against ca_file. Insecure credentials when mTLS is off.
std::shared_ptr<grpc::ChannelCredentials> PeerChannelCredentials(const PeerTlsOptions& options);

// Whether a server refuses callers without a certificate at the handshake, or lets them in
// (still refusing a certificate that fails verification) for the handlers to decide: the
// router's one gRPC port serves the public Inference API, which clients reach without a client
// certificate, next to the Registry, which only workers may use.
enum class ClientCertificates { kRequire, kVerifyIfPresented };

// PeerServerCredentials: TLS with cert_file, client certificates verified against ca_file as
// `policy` says. Insecure credentials when mTLS is off.
std::shared_ptr<grpc::ServerCredentials> PeerServerCredentials(const PeerTlsOptions& options,
                                                               ClientCertificates policy);

// HasVerifiedPeerCertificate: whether the caller of `context` presented a certificate that
// passed verification (false on a plaintext connection).
bool HasVerifiedPeerCertificate(const grpc::ServerContextBase& context);

}  // namespace sluice

#endif  // SLUICE_SERVICES_COMMON_PEER_TLS_H_
