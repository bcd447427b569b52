// The OpenID provider the SSO tests sign in through: the certified `oidc-provider` package,
// configured as a deployment's identity provider would be (authorization code flow, PKCE
// required, a `groups` claim). Accounts come from a JSON file the test rewrites, read again
// on every lookup, so a test moves a user between groups the way a directory admin would.
//
//   node provider.js <port> <accounts.json> <client_id> <client_secret> <redirect_uri>
//
// Prints "ready <issuer>" once it listens.
import fs from 'node:fs';
import Provider from 'oidc-provider';

const [port, accountsFile, clientId, clientSecret, redirectUri] = process.argv.slice(2);
const issuer = `http://127.0.0.1:${port}`;

function accounts() {
  return JSON.parse(fs.readFileSync(accountsFile, 'utf8'));
}

const provider = new Provider(issuer, {
  clients: [{
    client_id: clientId,
    client_secret: clientSecret,
    redirect_uris: [redirectUri],
    grant_types: ['authorization_code'],
    response_types: ['code'],
  }],
  // The interaction pages' cookies are signed; a fixed key is fine for a test provider.
  cookies: { keys: ['canopy-test-provider-cookie-key'] },
  pkce: { required: () => true },
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['preferred_username', 'name'],
    groups: ['groups'],
  },
  async findAccount(ctx, id) {
    const known = accounts()[id];
    return {
      accountId: id,
      async claims() {
        return {
          sub: id,
          email: known?.email ?? `${id}@example.test`,
          email_verified: true,
          preferred_username: id,
          name: known?.name ?? id,
          groups: known?.groups ?? [],
        };
      },
    };
  },
  // A first-party client: the directory already consented for it, so no consent page (what an
  // organisation's IdP does for its own applications).
  async loadExistingGrant(ctx) {
    const grantId = ctx.oidc.result?.consent?.grantId
      || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    if (!ctx.oidc.session.accountId) return undefined;
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId,
      accountId: ctx.oidc.session.accountId,
    });
    grant.addOIDCScope('openid email profile groups');
    await grant.save();
    return grant;
  },
  features: { devInteractions: { enabled: true } },
  ttl: { AccessToken: 3600, IdToken: 3600, Session: 3600, Interaction: 600, Grant: 3600 },
});

provider.listen(Number(port), '127.0.0.1', () => {
  console.log(`ready ${issuer}`);
});
