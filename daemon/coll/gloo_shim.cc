/*
 * gloo_shim.cc — see gloo_shim.h. Written against Debian 12's gloo
 * (0.0~git20220518.5b14351): options-style collectives, a tcp device, a
 * rendezvous Context over any Store. That version has no TCPStore, so the
 * store is the daemon's own (struct coll_store) behind a Store subclass.
 *
 * Aborting. This gloo has no call that fails the operations blocked on a
 * context: Context::closeConnections() closes the sockets but leaves every
 * waiter asleep until its timeout. What does wake them is gloo's own
 * handling of an application timeout: an UnboundBuffer wait that times out
 * calls the transport context's signalException(), which hands an exception
 * to every operation pending on every pair and closes the pairs. So abort()
 * waits 1 ms for a message that never comes, on a buffer of its own. Two
 * kinds of waiter are not reached that way: a receive whose payload is half
 * read and a send half written (no longer in the pairs' pending lists). For
 * those every call here registers its buffers while it runs, and a thread
 * started by the first abort() calls abortWaitRecv()/abortWaitSend() on them
 * every 2 ms until they are gone: each such wait returns at once, the
 * collective's next socket call throws on the closed pair, and the call
 * returns -ECANCELED. A collective that runs to its end through aborted
 * waits has garbage in its output, so once aborted every call reports
 * -ECANCELED whatever gloo said.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include "coll/gloo_shim.h"

using std::chrono::milliseconds;
using UBuf = gloo::transport::UnboundBuffer;

namespace
{

/* An error this file raises itself, with the code it maps to. */
struct ShimError : std::runtime_error {
	int code;
	ShimError(int c, const std::string &m) : std::runtime_error(m), code(c)
	{
	}
};

/* gloo's Store over the daemon's coll_store; keys get the mesh's prefix.
 * gloo's rendezvous names each node's key by its rank, so a key that never
 * appears names the node that did not join. */
class CStore : public gloo::rendezvous::Store
{
      public:
	CStore(const coll_store *s, std::string prefix, milliseconds timeout)
	    : s_(s), prefix_(std::move(prefix)), timeout_(timeout)
	{
	}

	void set(const std::string &key, const std::vector<char> &data) override
	{
		int r = s_->set(s_->ctx, (prefix_ + key).c_str(), data.data(), data.size());
		if (r < 0)
			throw ShimError(r, "store: set " + key + ": " + zc_strerror(r));
	}

	std::vector<char> get(const std::string &key) override
	{
		return fetch(key, timeout_, timeout_);
	}

	void wait(const std::vector<std::string> &keys) override
	{
		wait(keys, timeout_);
	}

	void wait(const std::vector<std::string> &keys, const milliseconds &timeout) override
	{
		auto end = std::chrono::steady_clock::now() + timeout;
		for (const auto &k : keys) {
			auto left = std::chrono::duration_cast<milliseconds>(
				end - std::chrono::steady_clock::now());
			fetch(k, std::max(left, milliseconds(0)), timeout);
		}
	}

      private:
	/* wait up to left; `timeout` is the whole wait, for the message */
	std::vector<char> fetch(const std::string &key, milliseconds left, milliseconds timeout)
	{
		void *v = nullptr;
		size_t len = 0;
		int r = s_->get(s_->ctx, (prefix_ + key).c_str(), (int)left.count(), &v, &len);
		if (r == -ETIMEDOUT)
			throw ShimError(r, "node " + key + " did not join within " +
						   std::to_string(timeout.count()) + " ms");
		if (r < 0)
			throw ShimError(r, "store: get " + key + ": " + zc_strerror(r));
		std::vector<char> out(static_cast<char *>(v), static_cast<char *>(v) + len);
		free(v);
		return out;
	}

	const coll_store *s_;
	std::string prefix_;
	milliseconds timeout_;
};

} // namespace

struct gloo_shim {
	std::shared_ptr<gloo::transport::Device> dev;
	std::shared_ptr<gloo::rendezvous::Context> ctx;
	milliseconds timeout{0};

	std::mutex mu;
	std::condition_variable cv;
	std::vector<UBuf *> inflight; /* the buffers of the calls running now */
	bool aborted = false;
	bool closing = false;
	std::thread reaper;
};

namespace
{

/* A call's buffers, known to abort() for as long as the call runs. Declared
 * after the options that own the buffers, so it forgets them first. */
class Inflight
{
      public:
	Inflight(gloo_shim *s, std::initializer_list<UBuf *> bufs) : s_(s), bufs_(bufs)
	{
		std::lock_guard<std::mutex> lock(s_->mu);
		if (s_->aborted)
			throw ShimError(-ECANCELED, "aborted");
		s_->inflight.insert(s_->inflight.end(), bufs_.begin(), bufs_.end());
	}
	~Inflight()
	{
		std::lock_guard<std::mutex> lock(s_->mu);
		for (UBuf *b : bufs_) {
			auto it = std::find(s_->inflight.begin(), s_->inflight.end(), b);
			if (it != s_->inflight.end())
				s_->inflight.erase(it);
		}
	}
	Inflight(gloo_shim *s, const std::vector<UBuf *> &bufs) : s_(s), bufs_(bufs)
	{
		std::lock_guard<std::mutex> lock(s_->mu);
		if (s_->aborted)
			throw ShimError(-ECANCELED, "aborted");
		s_->inflight.insert(s_->inflight.end(), bufs_.begin(), bufs_.end());
	}
	Inflight(const Inflight &) = delete;
	Inflight &operator=(const Inflight &) = delete;

      private:
	gloo_shim *s_;
	std::vector<UBuf *> bufs_;
};

int fail(char *err, size_t errlen, int code, const char *what)
{
	if (err && errlen)
		snprintf(err, errlen, "%s", what);
	return code;
}

bool contains(const char *s, const char *what)
{
	return strstr(s, what) != nullptr;
}

/* Run fn and turn whatever it throws into a code and a message. */
template <typename F> int guarded(gloo_shim *s, char *err, size_t errlen, F &&fn)
{
	int r = 0;
	std::string msg;

	try {
		fn();
	} catch (const ShimError &e) {
		r = e.code;
		msg = e.what();
	} catch (const gloo::IoException &e) {
		/* a timeout here wakes every other waiter with "Application
		 * timeout caused pair closure": a timeout too */
		const char *w = e.what();
		r = contains(w, "imeout") || contains(w, "imed out") ? -ETIMEDOUT : -ECONNRESET;
		msg = w;
	} catch (const gloo::EnforceNotMet &e) {
		r = -EINVAL;
		msg = e.what();
	} catch (const std::bad_alloc &) {
		r = -ENOMEM;
		msg = "out of memory";
	} catch (const std::exception &e) {
		r = -EIO;
		msg = e.what();
	} catch (...) {
		r = -EIO;
		msg = "unknown exception";
	}
	if (s) {
		std::lock_guard<std::mutex> lock(s->mu);
		if (s->aborted)
			return fail(err, errlen, -ECANCELED, "aborted");
	}
	if (r < 0)
		return fail(err, errlen, r, msg.c_str());
	return 0;
}

/* The thread the first abort() starts: keeps waking the waiters gloo's
 * signalException() cannot reach (see the top of this file). */
void reap(gloo_shim *s)
{
	std::unique_lock<std::mutex> lock(s->mu);
	while (!s->closing) {
		for (UBuf *b : s->inflight) {
			b->abortWaitRecv();
			b->abortWaitSend();
		}
		if (s->inflight.empty())
			s->cv.wait(lock);
		else
			s->cv.wait_for(lock, milliseconds(2));
	}
}

} // namespace

extern "C" int gloo_shim_open(const struct gloo_shim_config *cfg, struct gloo_shim **ret, char *err,
			      size_t errlen)
{
	if (cfg->size < 1 || cfg->rank < 0 || cfg->rank >= cfg->size || cfg->timeout_ms <= 0 ||
	    !cfg->store || !cfg->prefix || (!cfg->host && !cfg->iface))
		return fail(err, errlen, -EINVAL, "bad gloo configuration");
	gloo_shim *s = new (std::nothrow) gloo_shim;
	if (!s)
		return fail(err, errlen, -ENOMEM, "out of memory");
	s->timeout = milliseconds(cfg->timeout_ms);
	int r = guarded(nullptr, err, errlen, [&] {
		gloo::transport::tcp::attr attr;
		if (cfg->host)
			attr.hostname = cfg->host;
		else
			attr.iface = cfg->iface;
		s->dev = gloo::transport::tcp::CreateDevice(attr);
		s->ctx = std::make_shared<gloo::rendezvous::Context>(cfg->rank, cfg->size);
		s->ctx->setTimeout(s->timeout);
		CStore store(cfg->store, cfg->prefix, s->timeout);
		s->ctx->connectFullMesh(store, s->dev);
	});
	if (r < 0) {
		gloo_shim_close(s);
		return r;
	}
	*ret = s;
	return 0;
}

extern "C" int gloo_shim_alltoallv(struct gloo_shim *s, uint32_t tag, const float *in,
				   const size_t *send_counts, float *out, const size_t *recv_counts,
				   char *err, size_t errlen)
{
	return guarded(s, err, errlen, [&] {
		gloo::AlltoallvOptions o(s->ctx);
		std::vector<int64_t> sc(send_counts, send_counts + s->ctx->size);
		std::vector<int64_t> rc(recv_counts, recv_counts + s->ctx->size);
		size_t ns = 0, nr = 0;
		for (int j = 0; j < s->ctx->size; j++)
			ns += send_counts[j], nr += recv_counts[j];
		/* gloo never writes through its input buffer */
		auto ib = s->ctx->createUnboundBuffer(const_cast<float *>(in), ns * sizeof(float));
		auto ob = s->ctx->createUnboundBuffer(out, nr * sizeof(float));
		UBuf *ibp = ib.get(), *obp = ob.get();
		o.setInput<float>(std::move(ib), std::move(sc));
		o.setOutput<float>(std::move(ob), std::move(rc));
		o.setTag(tag);
		o.setTimeout(s->timeout);
		Inflight f(s, {ibp, obp});
		gloo::alltoallv(o);
	});
}

extern "C" int gloo_shim_allgatherv(struct gloo_shim *s, uint32_t tag, float *out,
				    const size_t *counts, char *err, size_t errlen)
{
	return guarded(s, err, errlen, [&] {
		gloo::AllgathervOptions o(s->ctx);
		std::vector<size_t> c(counts, counts + s->ctx->size);
		size_t n = 0;
		for (int j = 0; j < s->ctx->size; j++)
			n += counts[j];
		auto ob = s->ctx->createUnboundBuffer(out, n * sizeof(float));
		UBuf *obp = ob.get();
		o.setOutput<float>(std::move(ob), std::move(c));
		o.setTag(tag);
		o.setTimeout(s->timeout);
		Inflight f(s, {obp});
		gloo::allgatherv(o);
	});
}

extern "C" int gloo_shim_broadcast(struct gloo_shim *s, uint32_t tag, int root, float *buf,
				   size_t n, char *err, size_t errlen)
{
	return guarded(s, err, errlen, [&] {
		gloo::BroadcastOptions o(s->ctx);
		auto ob = s->ctx->createUnboundBuffer(buf, n * sizeof(float));
		UBuf *obp = ob.get();
		o.setOutput<float>(std::move(ob));
		o.setRoot(root);
		o.setTag(tag);
		o.setTimeout(s->timeout);
		Inflight f(s, {obp});
		gloo::broadcast(o);
	});
}

extern "C" int gloo_shim_broadcasts(struct gloo_shim *s, const struct gloo_shim_bcast *b, size_t n,
				    char *err, size_t errlen)
{
	return guarded(s, err, errlen, [&] {
		const int me = s->ctx->rank, peer = 1 - me;
		std::vector<std::unique_ptr<UBuf>> ub;
		std::vector<UBuf *> raw;

		if (s->ctx->size != 2)
			throw ShimError(-EINVAL, "broadcasts: two nodes only");
		for (size_t i = 0; i < n; i++) {
			if (b[i].root < 0 || b[i].root > 1)
				throw ShimError(-EINVAL, "broadcasts: no such root");
			ub.push_back(s->ctx->createUnboundBuffer(b[i].buf, b[i].n * sizeof(float)));
			raw.push_back(ub.back().get());
		}
		Inflight f(s, raw);
		/* each on its own slot (its tag), as gloo::broadcast's */
		for (size_t i = 0; i < n; i++) {
			uint64_t slot = gloo::Slot::build(gloo::kBroadcastSlotPrefix, b[i].tag);
			if (b[i].root == me)
				ub[i]->send(peer, slot);
			else
				ub[i]->recv(peer, slot);
		}
		for (size_t i = 0; i < n; i++) {
			bool ok = b[i].root == me ? ub[i]->waitSend(s->timeout)
						  : ub[i]->waitRecv(s->timeout);
			if (!ok)
				throw ShimError(-ECANCELED, "broadcasts: aborted");
		}
	});
}

extern "C" int gloo_shim_allreduce_sum(struct gloo_shim *s, uint32_t tag, float *buf, size_t n,
				       char *err, size_t errlen)
{
	return guarded(s, err, errlen, [&] {
		gloo::AllreduceOptions o(s->ctx);
		auto ob = s->ctx->createUnboundBuffer(buf, n * sizeof(float));
		UBuf *obp = ob.get();
		o.setOutput<float>(std::move(ob));
		o.setReduceFunction(
			static_cast<void (*)(void *, const void *, const void *, size_t)>(
				&gloo::sum<float>));
		o.setTag(tag);
		o.setTimeout(s->timeout);
		Inflight f(s, {obp});
		gloo::allreduce(o);
	});
}

extern "C" void gloo_shim_abort(struct gloo_shim *s)
{
	{
		std::lock_guard<std::mutex> lock(s->mu);
		if (s->aborted)
			return;
		s->aborted = true;
	}
	try {
		char byte;
		auto b = s->ctx->createUnboundBuffer(&byte, 1);
		b->waitRecv(nullptr, milliseconds(1));
	} catch (...) {
		/* the timeout we asked for: every pair is signalled and closed */
	}
	try {
		std::lock_guard<std::mutex> lock(s->mu);
		s->reaper = std::thread(reap, s);
	} catch (...) {
		/* no thread: half-transferred waits end at their timeout instead */
	}
}

extern "C" void gloo_shim_close(struct gloo_shim *s)
{
	if (!s)
		return;
	{
		std::lock_guard<std::mutex> lock(s->mu);
		s->closing = true;
		s->cv.notify_all();
	}
	if (s->reaper.joinable())
		s->reaper.join();
	try {
		s->ctx.reset();
		s->dev.reset();
	} catch (...) {
		/* destructors that throw: nothing more to free */
	}
	delete s;
}
