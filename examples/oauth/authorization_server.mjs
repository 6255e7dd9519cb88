// A real OAuth 2.1 authorization server for tests/sign_in.rs: oidc-provider with resource
// indicators (RFC 8707) and JWT access tokens, and client-credentials clients that get their
// tokens signed with RS256, ES256 or EdDSA, or that expire after a second. A client's tokens
// name it as their subject; one client's id is 256 bytes long, more than a resource server
// should take as a user name.
//
//     node authorization_server.mjs PORT KEYS_FILE
//
// KEYS_FILE holds the signing keys (private JWKs); it is created when missing, so that two
// servers on two ports (two issuers) can share one set of keys. Prints "listening" when ready.
import { generateKeyPairSync, randomUUID } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import Provider from 'oidc-provider';

const [port, keysFile] = process.argv.slice(2);
const issuer = `http://127.0.0.1:${port}`;

function privateJwk(type, options, alg) {
    const { privateKey } = generateKeyPairSync(type, options);
    return { ...privateKey.export({ format: 'jwk' }), kid: randomUUID(), alg, use: 'sig' };
}
if (!existsSync(keysFile)) {
    const keys = [
        privateJwk('rsa', { modulusLength: 2048 }, 'RS256'),
        privateJwk('ec', { namedCurve: 'P-256' }, 'ES256'),
        privateJwk('ed25519', {}, 'EdDSA'),
    ];
    writeFileSync(keysFile, JSON.stringify({ keys }));
}
const jwks = JSON.parse(readFileSync(keysFile, 'utf8'));
// Steps on stderr, so that a start that hangs says where.
console.error('signing keys ready');

// client id -> [signing algorithm, token lifetime in seconds]
const clients = {
    'tests-rs256': ['RS256', 600],
    'tests-es256': ['ES256', 600],
    'tests-eddsa': ['EdDSA', 600],
    'tests-short': ['ES256', 1],
    ['tests-long-subject-'.padEnd(256, 'x')]: ['ES256', 600],
};
const SCOPES = 'movies:read watchlist:write';

const provider = new Provider(issuer, {
    jwks,
    clients: Object.keys(clients).map(client_id => ({
        client_id,
        client_secret: `${client_id}-secret`,
        grant_types: ['client_credentials'],
        redirect_uris: [],
        response_types: [],
        token_endpoint_auth_method: 'client_secret_basic',
    })),
    scopes: SCOPES.split(' '),
    features: {
        devInteractions: { enabled: false },
        clientCredentials: { enabled: true },
        resourceIndicators: {
            enabled: true,
            // A client that names no resource gets none; every resource it names is granted.
            defaultResource: () => undefined,
            useGrantedResource: () => true,
            getResourceServerInfo: (ctx, resource, client) => {
                const [alg, ttl] = clients[client.clientId];
                return {
                    scope: SCOPES,
                    audience: resource,
                    accessTokenFormat: 'jwt',
                    accessTokenTTL: ttl,
                    jwt: { sign: { alg } },
                };
            },
        },
    },
});
console.error(`provider built, binding 127.0.0.1:${port}`);
provider.listen(Number(port), '127.0.0.1', () => console.log('listening'));
