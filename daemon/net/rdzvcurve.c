/*
 * rdzvcurve.c — CURVE keys and the secure channel of the rendezvous (see
 * rdzvcurve.h). Every primitive is libsodium's: X25519 (crypto_scalarmult),
 * BLAKE2b (crypto_generichash), its KDF, HMAC-SHA256 (crypto_auth_hmacsha256)
 * and crypto_secretstream_xchacha20poly1305; Z85 is libzmq's, so the keys
 * are the ones ZeroMQ's CURVE users know (zmq_curve_keypair).
 *
 * Why four X25519 results: fresh-fresh gives each connection keys of its
 * own that a later theft of the long-term keys does not open; each long-
 * term key enters with the other side's fresh key and with the other's
 * long-term key, so only the holders of both secret keys can derive the
 * channel's keys, and a stolen secret key of one side does not let anyone
 * pose as the other side to it. The proofs make that explicit at once (a
 * clear refusal rather than a first frame that fails to open).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>
#include <zmq.h>

#include "common.h"
#include "net/rdzvcurve.h"
#include "net/rdzvwire.h"
#include "zeroclient.h"

#define KB RDZV_CURVE_KEY_BYTES

struct rdzv_keys {
	uint8_t pk[KB];
	uint8_t *sk; /* sodium_malloc(): guarded pages, locked, wiped when freed */
	char z85[RDZV_CURVE_Z85_LEN + 1];
	uint8_t (*peers)[KB];
	unsigned npeers;
};

enum sec_state {
	SEC_NEW,     /* client: Curve not sent; server: waits for the client's Curve */
	SEC_REPLIED, /* server: sent its Curve, waits for CurveAuth */
	SEC_AUTHED,  /* client: CurveAuth built, not yet sent */
	SEC_READY,   /* sealed both ways */
};

struct rdzv_sec {
	const struct rdzv_keys *k;
	bool server;
	enum sec_state st;
	bool broken;                       /* a frame failed to open: nothing more will */
	uint8_t epk[KB], esk[KB];          /* this side's fresh pair */
	uint8_t nonce[RDZV_NONCE_BYTES];   /* this side's */
	uint8_t peer_pk[KB], peer_epk[KB]; /* the other side's */
	uint8_t peer_nonce[RDZV_NONCE_BYTES];
	uint8_t proof[crypto_auth_hmacsha256_BYTES];      /* this side's, to send */
	uint8_t peer_proof[crypto_auth_hmacsha256_BYTES]; /* what the other must send */
	uint8_t rx_key[KB];
	uint8_t header[crypto_secretstream_xchacha20poly1305_HEADERBYTES]; /* this side's push
									      header */
	crypto_secretstream_xchacha20poly1305_state tx, rx;
	char peer_z85[RDZV_CURVE_Z85_LEN + 1];
	/* raw frames (rdzv_sec_seal): AES-256-GCM once both ends agreed
	 * (rdzv_sec_use_aes), under keys of their own, nonces counting up */
	uint8_t tx_bulk[KB], rx_bulk[KB];
	bool aes;
	uint64_t tx_ctr, rx_ctr;
	crypto_aead_aes256gcm_state tx_aes, rx_aes;
};

/* ----------------------------------------------------------- keys --- */

bool rdzv_curve_z85_decode(const char *text, uint8_t out[KB])
{
	return strlen(text) == RDZV_CURVE_Z85_LEN && zmq_z85_decode(out, text) != NULL;
}

void rdzv_curve_z85_encode(const uint8_t key[KB], char out[RDZV_CURVE_Z85_LEN + 1])
{
	zmq_z85_encode(out, key, KB);
}

/* The text of a line without surrounding blanks; "" for a comment (a line
 * whose first character is '#': Z85 itself has '#', so not after a key). */
static char *trim(char *line)
{
	char *end;

	while (*line == ' ' || *line == '\t')
		line++;
	if (*line == '#')
		*line = '\0';
	end = line + strlen(line);
	while (end > line && strchr(" \t\r\n", end[-1]))
		*--end = '\0';
	return line;
}

static int load_secret(struct rdzv_keys *k, const char *path, char *err, size_t len)
{
	char line[256], *t;
	struct stat st;
	int fd = open(path, O_RDONLY | O_CLOEXEC), r = -EINVAL, n = 0;
	FILE *f;

	if (fd < 0) {
		r = -errno;
		snprintf(err, len, "%s: %s", path, strerror(errno));
		return r;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		snprintf(err, len, "%s: not a regular file", path);
		close(fd);
		return -EINVAL;
	}
	if (st.st_mode & 077) {
		snprintf(err, len,
			 "%s: mode %04o: a secret key must not be readable by group or others "
			 "(chmod 600)",
			 path, (unsigned)(st.st_mode & 07777));
		close(fd);
		return -EPERM;
	}
	f = fdopen(fd, "r");
	if (!f) {
		r = -errno;
		close(fd);
		snprintf(err, len, "%s: %s", path, strerror(-r));
		return r;
	}
	while (fgets(line, sizeof(line), f)) {
		n++;
		t = trim(line);
		if (!*t)
			continue;
		if (!rdzv_curve_z85_decode(t, k->sk))
			snprintf(err, len, "%s:%d: not a CURVE secret key (%d characters of Z85)",
				 path, n, RDZV_CURVE_Z85_LEN);
		else
			r = 0;
		break;
	}
	if (r < 0 && !n)
		snprintf(err, len, "%s: empty: no CURVE secret key", path);
	else if (r < 0 && !strchr(err, ':'))
		snprintf(err, len, "%s: no CURVE secret key in it", path);
	sodium_memzero(line, sizeof(line));
	fclose(f);
	if (r < 0)
		return r;
	crypto_scalarmult_base(k->pk, k->sk);
	rdzv_curve_z85_encode(k->pk, k->z85);
	return 0;
}

static int load_peers(struct rdzv_keys *k, const char *path, char *err, size_t len)
{
	FILE *f = fopen(path, "re");
	char line[256], *t;
	int n = 0;

	if (!f) {
		int r = -errno;
		snprintf(err, len, "%s: %s", path, strerror(errno));
		return r;
	}
	while (fgets(line, sizeof(line), f)) {
		uint8_t key[KB];
		n++;
		if (!strchr(line, '\n') && !feof(f)) {
			snprintf(err, len, "%s:%d: a line too long for a key", path, n);
			fclose(f);
			return -EINVAL;
		}
		t = trim(line);
		if (!*t)
			continue;
		if (!rdzv_curve_z85_decode(t, key)) {
			snprintf(err, len,
				 "%s:%d: not a CURVE public key (%d characters of Z85, one a line)",
				 path, n, RDZV_CURVE_Z85_LEN);
			fclose(f);
			return -EINVAL;
		}
		if (k->npeers >= RDZV_CURVE_MAX_PEERS) {
			snprintf(err, len, "%s:%d: more than %d keys", path, n,
				 RDZV_CURVE_MAX_PEERS);
			fclose(f);
			return -EINVAL;
		}
		if (k->npeers % 64 == 0) {
			void *p = realloc(k->peers, (k->npeers + 64) * sizeof(*k->peers));
			if (!p) {
				fclose(f);
				snprintf(err, len, "out of memory");
				return -ENOMEM;
			}
			k->peers = p;
		}
		memcpy(k->peers[k->npeers++], key, KB);
	}
	fclose(f);
	return 0;
}

int rdzv_keys_load(const char *secret_path, const char *peers_path, struct rdzv_keys **ret,
		   char *err, size_t errlen)
{
	bool has_secret = secret_path && secret_path[0], has_peers = peers_path && peers_path[0];
	struct rdzv_keys *k;
	int r;

	*ret = NULL;
	if (!has_secret && !has_peers)
		return 0;
	if (!has_secret || !has_peers) {
		snprintf(err, errlen, "%s without %s: CURVE needs both",
			 has_secret ? "--curve-secret-key" : "--curve-peers",
			 has_secret ? "--curve-peers" : "--curve-secret-key");
		return -EINVAL;
	}
	if (sodium_init() < 0) {
		snprintf(err, errlen, "libsodium does not start");
		return -EIO;
	}
	k = calloc(1, sizeof(*k));
	if (k)
		k->sk = sodium_malloc(KB);
	if (!k || !k->sk) {
		free(k);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	r = load_secret(k, secret_path, err, errlen);
	if (r >= 0)
		r = load_peers(k, peers_path, err, errlen);
	if (r < 0) {
		rdzv_keys_free(k);
		return r;
	}
	*ret = k;
	return 0;
}

void rdzv_keys_free(struct rdzv_keys *k)
{
	if (!k)
		return;
	free(k->peers);
	sodium_free(k->sk); /* wipes it */
	free(k);
}

const char *rdzv_keys_public(const struct rdzv_keys *k)
{
	return k->z85;
}

unsigned rdzv_keys_npeers(const struct rdzv_keys *k)
{
	return k->npeers;
}

static bool trusted(const struct rdzv_keys *k, const uint8_t pk[KB])
{
	if (sodium_memcmp(pk, k->pk, KB) == 0)
		return true;
	for (unsigned i = 0; i < k->npeers; i++)
		if (sodium_memcmp(pk, k->peers[i], KB) == 0)
			return true;
	return false;
}

/* -------------------------------------------------------- channel --- */

int rdzv_sec_new(const struct rdzv_keys *k, bool server, struct rdzv_sec **ret)
{
	struct rdzv_sec *s = calloc(1, sizeof(*s));

	if (!s)
		return -ENOMEM;
	s->k = k;
	s->server = server;
	crypto_box_keypair(s->epk, s->esk);
	randombytes_buf(s->nonce, sizeof(s->nonce));
	snprintf(s->peer_z85, sizeof(s->peer_z85), "?");
	*ret = s;
	return 0;
}

void rdzv_sec_free(struct rdzv_sec *s)
{
	if (!s)
		return;
	sodium_memzero(s, sizeof(*s));
	free(s);
}

const char *rdzv_sec_peer(const struct rdzv_sec *s)
{
	return s->peer_z85;
}

bool rdzv_sec_ready(const struct rdzv_sec *s)
{
	return s->st == SEC_READY;
}

void rdzv_sec_start(struct rdzv_sec *s)
{
	if (s->st == SEC_AUTHED)
		s->st = SEC_READY;
}

static bool bytes_ok(const ProtobufCBinaryData *b, size_t n)
{
	return b->len == n && b->data;
}

/* The other side's Curve into s: false with why if it is malformed. */
static bool take_peer(struct rdzv_sec *s, const Zerod__V1__RdzvCurve *in, char *why, size_t len)
{
	if (!bytes_ok(&in->static_key, KB) || !bytes_ok(&in->ephemeral_key, KB) ||
	    !bytes_ok(&in->nonce, RDZV_NONCE_BYTES)) {
		snprintf(why, len, "a malformed Curve message (keys of 32 bytes wanted)");
		return false;
	}
	memcpy(s->peer_pk, in->static_key.data, KB);
	memcpy(s->peer_epk, in->ephemeral_key.data, KB);
	memcpy(s->peer_nonce, in->nonce.data, RDZV_NONCE_BYTES);
	rdzv_curve_z85_encode(s->peer_pk, s->peer_z85);
	return true;
}

/* Both sides' keys of the connection from the four X25519 results and the
 * transcript. False if a key is weak (a small-order point). */
static bool derive(struct rdzv_sec *s, uint8_t tx_key[KB], uint8_t rx_key[KB])
{
	static const char label[] = "zerod rendezvous curve 1";
	const uint8_t *cpk, *cepk, *spk, *sepk, *cn, *sn;
	uint8_t dh[4][crypto_scalarmult_BYTES], master[crypto_kdf_KEYBYTES];
	uint8_t c2s[KB], s2c[KB], cproof[crypto_auth_hmacsha256_KEYBYTES],
		sproof[crypto_auth_hmacsha256_KEYBYTES], c2s_bulk[KB], s2c_bulk[KB];
	crypto_generichash_state h;
	int bad;

	if (s->server) {
		cpk = s->peer_pk, cepk = s->peer_epk, cn = s->peer_nonce;
		spk = s->k->pk, sepk = s->epk, sn = s->nonce;
		/* ee, es (client fresh, server long-term), se, ss */
		bad = crypto_scalarmult(dh[0], s->esk, cepk) |
		      crypto_scalarmult(dh[1], s->k->sk, cepk) |
		      crypto_scalarmult(dh[2], s->esk, cpk) |
		      crypto_scalarmult(dh[3], s->k->sk, cpk);
	} else {
		cpk = s->k->pk, cepk = s->epk, cn = s->nonce;
		spk = s->peer_pk, sepk = s->peer_epk, sn = s->peer_nonce;
		bad = crypto_scalarmult(dh[0], s->esk, sepk) |
		      crypto_scalarmult(dh[1], s->esk, spk) |
		      crypto_scalarmult(dh[2], s->k->sk, sepk) |
		      crypto_scalarmult(dh[3], s->k->sk, spk);
	}
	if (bad) {
		sodium_memzero(dh, sizeof(dh));
		return false;
	}
	crypto_generichash_init(&h, NULL, 0, sizeof(master));
	crypto_generichash_update(&h, (const uint8_t *)label, sizeof(label));
	crypto_generichash_update(&h, &dh[0][0], sizeof(dh));
	crypto_generichash_update(&h, cpk, KB);
	crypto_generichash_update(&h, cepk, KB);
	crypto_generichash_update(&h, spk, KB);
	crypto_generichash_update(&h, sepk, KB);
	crypto_generichash_update(&h, cn, RDZV_NONCE_BYTES);
	crypto_generichash_update(&h, sn, RDZV_NONCE_BYTES);
	crypto_generichash_final(&h, master, sizeof(master));
	crypto_kdf_derive_from_key(c2s, sizeof(c2s), 1, "zerodrdv", master);
	crypto_kdf_derive_from_key(s2c, sizeof(s2c), 2, "zerodrdv", master);
	crypto_kdf_derive_from_key(cproof, sizeof(cproof), 3, "zerodrdv", master);
	crypto_kdf_derive_from_key(sproof, sizeof(sproof), 4, "zerodrdv", master);
	crypto_kdf_derive_from_key(c2s_bulk, sizeof(c2s_bulk), 5, "zerodrdv", master);
	crypto_kdf_derive_from_key(s2c_bulk, sizeof(s2c_bulk), 6, "zerodrdv", master);
	memcpy(s->tx_bulk, s->server ? s2c_bulk : c2s_bulk, KB);
	memcpy(s->rx_bulk, s->server ? c2s_bulk : s2c_bulk, KB);
	sodium_memzero(c2s_bulk, sizeof(c2s_bulk));
	sodium_memzero(s2c_bulk, sizeof(s2c_bulk));
	{
		static const char cl[] = "zerod curve 1: client", sl[] = "zerod curve 1: server";
		crypto_auth_hmacsha256(s->server ? s->proof : s->peer_proof, (const uint8_t *)sl,
				       sizeof(sl), sproof);
		crypto_auth_hmacsha256(s->server ? s->peer_proof : s->proof, (const uint8_t *)cl,
				       sizeof(cl), cproof);
	}
	memcpy(tx_key, s->server ? s2c : c2s, KB);
	memcpy(rx_key, s->server ? c2s : s2c, KB);
	sodium_memzero(dh, sizeof(dh));
	sodium_memzero(master, sizeof(master));
	sodium_memzero(c2s, sizeof(c2s));
	sodium_memzero(s2c, sizeof(s2c));
	sodium_memzero(cproof, sizeof(cproof));
	sodium_memzero(sproof, sizeof(sproof));
	sodium_memzero(&h, sizeof(h));
	return true;
}

void rdzv_sec_hello(struct rdzv_sec *s, Zerod__V1__RdzvCurve *out)
{
	zerod__v1__rdzv_curve__init(out);
	out->static_key = (ProtobufCBinaryData){KB, (uint8_t *)s->k->pk};
	out->ephemeral_key = (ProtobufCBinaryData){KB, s->epk};
	out->nonce = (ProtobufCBinaryData){RDZV_NONCE_BYTES, s->nonce};
}

int rdzv_sec_on_hello(struct rdzv_sec *s, const Zerod__V1__RdzvCurve *in, Zerod__V1__RdzvCurve *out,
		      char *why, size_t len)
{
	uint8_t tx_key[KB];

	if (!s->server || s->st != SEC_NEW) {
		snprintf(why, len, "a Curve message out of turn");
		return ZC_EPROTO;
	}
	if (!take_peer(s, in, why, len))
		return ZC_ECONNECT;
	if (!trusted(s->k, s->peer_pk)) {
		snprintf(why, len, "CURVE key %s is not among the authorized keys", s->peer_z85);
		return ZC_ECONNECT;
	}
	if (!derive(s, tx_key, s->rx_key)) {
		snprintf(why, len, "a weak CURVE key");
		return ZC_ECONNECT;
	}
	crypto_secretstream_xchacha20poly1305_init_push(&s->tx, s->header, tx_key);
	sodium_memzero(tx_key, sizeof(tx_key));
	rdzv_sec_hello(s, out);
	out->has_proof = out->has_header = 1;
	out->proof = (ProtobufCBinaryData){sizeof(s->proof), s->proof};
	out->header = (ProtobufCBinaryData){sizeof(s->header), s->header};
	s->st = SEC_REPLIED;
	return 0;
}

int rdzv_sec_on_reply(struct rdzv_sec *s, const Zerod__V1__RdzvCurve *in,
		      Zerod__V1__RdzvCurveAuth *out, char *why, size_t len)
{
	uint8_t tx_key[KB];
	int r = ZC_ECONNECT;

	if (s->server || s->st != SEC_NEW) {
		snprintf(why, len, "a Curve message out of turn");
		return ZC_EPROTO;
	}
	if (!take_peer(s, in, why, len))
		return r;
	if (!in->has_proof || !in->has_header ||
	    !bytes_ok(&in->header, crypto_secretstream_xchacha20poly1305_HEADERBYTES)) {
		snprintf(why, len, "a Curve reply without a proof or a header");
		return r;
	}
	if (!trusted(s->k, s->peer_pk)) {
		snprintf(why, len,
			 "it presented CURVE key %s, which is not among this node's authorized "
			 "keys",
			 s->peer_z85);
		return r;
	}
	if (!derive(s, tx_key, s->rx_key)) {
		snprintf(why, len, "a weak CURVE key");
		return r;
	}
	if (!bytes_ok(&in->proof, sizeof(s->peer_proof)) ||
	    sodium_memcmp(in->proof.data, s->peer_proof, sizeof(s->peer_proof)) != 0) {
		snprintf(why, len, "it did not prove it holds the secret key of %s", s->peer_z85);
		sodium_memzero(tx_key, sizeof(tx_key));
		return r;
	}
	if (crypto_secretstream_xchacha20poly1305_init_pull(&s->rx, in->header.data, s->rx_key) !=
	    0) {
		snprintf(why, len, "a bad secretstream header");
		sodium_memzero(tx_key, sizeof(tx_key));
		return r;
	}
	crypto_secretstream_xchacha20poly1305_init_push(&s->tx, s->header, tx_key);
	sodium_memzero(tx_key, sizeof(tx_key));
	zerod__v1__rdzv_curve_auth__init(out);
	out->proof = (ProtobufCBinaryData){sizeof(s->proof), s->proof};
	out->header = (ProtobufCBinaryData){sizeof(s->header), s->header};
	s->st = SEC_AUTHED;
	return 0;
}

int rdzv_sec_on_auth(struct rdzv_sec *s, const Zerod__V1__RdzvCurveAuth *in, char *why, size_t len)
{
	if (!s->server || s->st != SEC_REPLIED) {
		snprintf(why, len, "a CurveAuth out of turn");
		return ZC_EPROTO;
	}
	if (!bytes_ok(&in->proof, sizeof(s->peer_proof)) ||
	    sodium_memcmp(in->proof.data, s->peer_proof, sizeof(s->peer_proof)) != 0) {
		snprintf(why, len, "CURVE key %s: no proof that the peer holds its secret key",
			 s->peer_z85);
		return ZC_ECONNECT;
	}
	if (!bytes_ok(&in->header, crypto_secretstream_xchacha20poly1305_HEADERBYTES) ||
	    crypto_secretstream_xchacha20poly1305_init_pull(&s->rx, in->header.data, s->rx_key) !=
		    0) {
		snprintf(why, len, "a bad secretstream header");
		return ZC_ECONNECT;
	}
	sodium_memzero(s->rx_key, sizeof(s->rx_key));
	s->st = SEC_READY;
	return 0;
}

/* ---------------------------------------------------------- frames --- */

int rdzv_sec_encode(struct rdzv_sec *s, const Zerod__V1__RdzvEnvelope *env, uint8_t **ret_buf,
		    size_t *ret_len)
{
	Zerod__V1__RdzvEnvelope outer = ZEROD__V1__RDZV_ENVELOPE__INIT;
	size_t n = zerod__v1__rdzv_envelope__get_packed_size(env);
	uint8_t *plain = malloc(n ? n : 1),
		*sealed = malloc(n + crypto_secretstream_xchacha20poly1305_ABYTES);
	unsigned long long clen;
	int r;

	if (!plain || !sealed) {
		free(plain);
		free(sealed);
		return -ENOMEM;
	}
	zerod__v1__rdzv_envelope__pack(env, plain);
	crypto_secretstream_xchacha20poly1305_push(
		&s->tx, sealed, &clen, plain, n, NULL, 0,
		crypto_secretstream_xchacha20poly1305_TAG_MESSAGE);
	sodium_memzero(plain, n);
	free(plain);
	outer.body_case = ZEROD__V1__RDZV_ENVELOPE__BODY_SEALED;
	outer.sealed = (ProtobufCBinaryData){(size_t)clen, sealed};
	r = rdzv_frame_encode(&outer, ret_buf, ret_len);
	free(sealed);
	return r;
}

int rdzv_sec_open(struct rdzv_sec *s, const ProtobufCBinaryData *sealed,
		  Zerod__V1__RdzvEnvelope **ret)
{
	unsigned long long mlen;
	unsigned char tag;
	uint8_t *plain;

	if (s->st != SEC_READY || s->broken ||
	    sealed->len < crypto_secretstream_xchacha20poly1305_ABYTES)
		return -EBADMSG;
	plain = malloc(sealed->len);
	if (!plain)
		return -ENOMEM;
	if (crypto_secretstream_xchacha20poly1305_pull(&s->rx, plain, &mlen, &tag, sealed->data,
						       sealed->len, NULL, 0) != 0 ||
	    tag != crypto_secretstream_xchacha20poly1305_TAG_MESSAGE) {
		free(plain);
		s->broken = true;
		return -EBADMSG;
	}
	*ret = rdzv_msg_decode(plain, (size_t)mlen);
	sodium_memzero(plain, (size_t)mlen);
	free(plain);
	return *ret ? 0 : -EPROTO;
}

_Static_assert(RDZV_SEC_ABYTES == crypto_secretstream_xchacha20poly1305_ABYTES &&
		       RDZV_SEC_ABYTES >= crypto_aead_aes256gcm_ABYTES,
	       "rdzvcurve.h's RDZV_SEC_ABYTES");

bool rdzv_sec_aes_available(void)
{
	return sodium_init() >= 0 && crypto_aead_aes256gcm_is_available();
}

int rdzv_sec_use_aes(struct rdzv_sec *s)
{
	if (s->st != SEC_READY || !rdzv_sec_aes_available())
		return -ENOTSUP;
	crypto_aead_aes256gcm_beforenm(&s->tx_aes, s->tx_bulk);
	crypto_aead_aes256gcm_beforenm(&s->rx_aes, s->rx_bulk);
	sodium_memzero(s->tx_bulk, sizeof(s->tx_bulk));
	sodium_memzero(s->rx_bulk, sizeof(s->rx_bulk));
	s->aes = true;
	return 0;
}

size_t rdzv_sec_abytes(const struct rdzv_sec *s)
{
	return s->aes ? crypto_aead_aes256gcm_ABYTES : crypto_secretstream_xchacha20poly1305_ABYTES;
}

/* The nonce of frame number ctr: it counts up from 0 in each direction,
 * under keys of that direction and connection alone, so it never repeats,
 * and a frame opened at another place in the stream fails. */
static void aes_nonce(uint8_t nonce[crypto_aead_aes256gcm_NPUBBYTES], uint64_t ctr)
{
	memset(nonce, 0, crypto_aead_aes256gcm_NPUBBYTES);
	for (int i = 0; i < 8; i++)
		nonce[i] = (uint8_t)(ctr >> (8 * i));
}

int rdzv_sec_seal(struct rdzv_sec *s, uint8_t *out, const void *in, size_t n)
{
	uint8_t nonce[crypto_aead_aes256gcm_NPUBBYTES];

	if (s->st != SEC_READY)
		return -EINVAL;
	if (s->aes) {
		aes_nonce(nonce, s->tx_ctr++);
		crypto_aead_aes256gcm_encrypt_afternm(out, NULL, in, n, NULL, 0, NULL, nonce,
						      &s->tx_aes);
		return 0;
	}
	crypto_secretstream_xchacha20poly1305_push(&s->tx, out, NULL, in, n, NULL, 0,
						   crypto_secretstream_xchacha20poly1305_TAG_MESSAGE);
	return 0;
}

int rdzv_sec_unseal(struct rdzv_sec *s, void *out, const uint8_t *in, size_t n)
{
	uint8_t nonce[crypto_aead_aes256gcm_NPUBBYTES];
	unsigned char tag;

	if (s->st != SEC_READY || s->broken || n <= rdzv_sec_abytes(s))
		return -EBADMSG;
	if (s->aes) {
		aes_nonce(nonce, s->rx_ctr++);
		if (crypto_aead_aes256gcm_decrypt_afternm(out, NULL, NULL, in, n, NULL, 0, nonce,
							  &s->rx_aes) == 0)
			return 0;
	} else if (crypto_secretstream_xchacha20poly1305_pull(&s->rx, out, NULL, &tag, in, n, NULL,
							      0) == 0 &&
		   tag == crypto_secretstream_xchacha20poly1305_TAG_MESSAGE) {
		return 0;
	}
	s->broken = true;
	return -EBADMSG;
}
