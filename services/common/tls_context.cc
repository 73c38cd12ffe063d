#include "services/common/tls_context.h"

#include <sys/stat.h>

#include "absl/strings/str_cat.h"

namespace sluice {

namespace ssl = boost::asio::ssl;

absl::StatusOr<std::unique_ptr<TlsContextSource>> TlsContextSource::Create(std::string cert_file,
                                                                          std::string key_file) {
  std::unique_ptr<TlsContextSource> source(
      new TlsContextSource(std::move(cert_file), std::move(key_file)));
  std::string stamp = source->Stamp();
  absl::StatusOr<std::shared_ptr<ssl::context>> context = source->Load();
  if (!context.ok()) return context.status();
  std::lock_guard<std::mutex> lock(source->mu_);
  source->context_ = *std::move(context);
  source->stamp_ = std::move(stamp);
  source->last_check_ = std::chrono::steady_clock::now();
  return source;
}

std::string TlsContextSource::Stamp() const {
  std::string stamp;
  for (const std::string* file : {&cert_file_, &key_file_}) {
    struct stat st {};
    if (stat(file->c_str(), &st) != 0) return "";
    absl::StrAppend(&stamp, st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec, ":", st.st_size, ";");
  }
  return stamp;
}

absl::StatusOr<std::shared_ptr<ssl::context>> TlsContextSource::Load() const {
  auto context = std::make_shared<ssl::context>(ssl::context::tls_server);
  context->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                       ssl::context::no_sslv3 | ssl::context::no_tlsv1 |
                       ssl::context::no_tlsv1_1 | ssl::context::single_dh_use);
  boost::system::error_code ec;
  context->use_certificate_chain_file(cert_file_, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot use TLS certificate '", cert_file_, "': ", ec.message()));
  }
  context->use_private_key_file(key_file_, ssl::context::pem, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot use TLS key '", key_file_, "': ", ec.message()));
  }
  if (SSL_CTX_check_private_key(context->native_handle()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("TLS key '", key_file_,
                                                   "' does not match certificate '", cert_file_,
                                                   "'"));
  }
  return context;
}

std::shared_ptr<ssl::context> TlsContextSource::Current() {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (now - last_check_ < check_period) return context_;
  last_check_ = now;
  std::string stamp = Stamp();
  if (stamp.empty() || stamp == stamp_) return context_;
  // A rotation may write the two files one after the other: a mismatched pair fails to load
  // and is retried when the second file lands (its stamp changes again).
  absl::StatusOr<std::shared_ptr<ssl::context>> context = Load();
  stamp_ = std::move(stamp);
  if (context.ok()) {
    context_ = *std::move(context);
    ++num_reloads_;
  }
  return context_;
}

int TlsContextSource::num_reloads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return num_reloads_;
}

}  // namespace sluice
