// The official TypeScript SDK client signing in to moviedb-mcp on its own: it starts without a
// token, gets 401, follows the server's Protected Resource Metadata to the authorization server,
// obtains a client-credentials token for the server's resource, and adds a movie to the watch
// list without a status, answering the server's question (an MRTR round). Prints the saved item.
//
//     node sdk_client.mjs MCP_URL ISSUER CLIENT_ID CLIENT_SECRET [MOVIE_ID]
import { Client, ClientCredentialsProvider, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';

const [url, issuer, clientId, clientSecret, movieId = '6'] = process.argv.slice(2);

const client = new Client(
    { name: 'sign-in-test', version: '1.0.0' },
    { capabilities: { elicitation: { form: {} } }, versionNegotiation: { mode: { pin: '2026-07-28' } } }
);
client.setRequestHandler('elicitation/create', async request => {
    console.error(`the server asks: ${request.params.message}`);
    return { action: 'accept', content: { status: 'WATCHED' } };
});
const authProvider = new ClientCredentialsProvider({ clientId, clientSecret, expectedIssuer: issuer });
await client.connect(new StreamableHTTPClientTransport(new URL(url), { authProvider }));
const result = await client.callTool({ name: 'addToWatchlist', arguments: { subject: { movieId } } });
await client.close();
if (result.isError) {
    console.error(`tool error: ${result.content[0].text}`);
    process.exit(1);
}
console.log(JSON.stringify(result.structuredContent));
