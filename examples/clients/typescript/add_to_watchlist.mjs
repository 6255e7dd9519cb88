// Adds a movie to the signed-in user's watch list with the official TypeScript SDK v2 client, on
// MCP 2026-07-28: the SDK runs the MRTR rounds itself and hands the server's question to the
// elicitation handler.
//
//     node add_to_watchlist.mjs URL TOKEN [MOVIE_ID]      (or MCP_URL, MCP_TOKEN, MOVIE_ID)
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';

const url = process.argv[2] ?? process.env.MCP_URL;
const token = process.argv[3] ?? process.env.MCP_TOKEN;
const movieId = process.argv[4] ?? process.env.MOVIE_ID ?? '6';

// The SDK's default era is the 2025-11-25 one; pin the stateless revision.
const client = new Client(
    { name: 'add-to-watchlist', version: '1.0.0' },
    { capabilities: { elicitation: { form: {} } }, versionNegotiation: { mode: { pin: '2026-07-28' } } }
);
client.setRequestHandler('elicitation/create', async request => {
    console.error(`the server asks: ${request.params.message}`);
    return { action: 'accept', content: { status: 'WATCHED' } };
});

await client.connect(
    new StreamableHTTPClientTransport(new URL(url), {
        requestInit: { headers: { Authorization: `Bearer ${token}` } }
    })
);
const result = await client.callTool({ name: 'addToWatchlist', arguments: { subject: { movieId } } });
await client.close();
if (result.isError) {
    console.error(`tool error: ${result.content[0].text}`);
    process.exit(1);
}
console.log(JSON.stringify(result.structuredContent, null, 2));
