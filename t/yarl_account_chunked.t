#!/usr/bin/perl

# yarl_account NAME $content_length with bodies whose length nginx learns only by reading
# them (Transfer-Encoding: chunked; HTTP/2 bodies without a length): the request is decided
# with weight 0, so a full quota still rejects it, and once it is done the body's length is
# charged to the chain. Before, such uploads counted nothing at all. A request without a
# body (a GET) counts 0, logged once per worker.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP ();
use Test::Yarl qw(http_get http_request status_of);

my $t = Test::Yarl->new();
$t->write_file('index.html', "hello\n");
$t->write_http_conf(<<'EOF2');
    yarl_roots %%ROOT_A%%;
    yarl_sync_interval 200ms;
    error_log %%TESTDIR%%/info.log info;
    server {
        listen 127.0.0.1:%%PORT_8080%%;
        root %%TESTDIR%%;
        location /up {
            yarl_account up $content_length;
            proxy_pass http://127.0.0.1:%%PORT_8081%%/;
        }
        location /sh {
            yarl_account sh $content_length;
            proxy_pass http://127.0.0.1:%%PORT_8081%%/;
        }
        location = /stats { yarl_stats; }
    }
    server {
        listen 127.0.0.1:%%PORT_8081%%;
        location / { return 200 "stored\n"; }
    }
EOF2
$t->run_root('A');
$t->run();
# 2,500 bytes with a hard cutoff, draining 1 byte in 1,000 s: nothing drains in the test.
$t->put_quota('up', 0.001, 2500, 2500);
ok($t->wait_quota($t->port(8080), 'up', 5), 'quota fetched');
# A quota in shadow mode under an enforced parent.
$t->put_quota('all', 0.001, 1e9, 1e9);
my ($st) = $t->admin('PUT', '/v1/quotas/sh',
	{ limit => 0.001, low_burst => 0, high_burst => 0, parent => 'all', dry_run => JSON::PP::true });
is($st, 200, 'a quota in shadow mode');
ok($t->wait_quota($t->port(8080), 'sh', 5), 'fetched');

my $fill = sub {
	my $s = $t->stats($t->port(8080), '/stats?quota=' . ($_[0] // 'up'));
	return $s && $s->{quota} ? $s->{quota}{fill} : -1;
};

sub chunked_post {
	my ($bytes, $path) = @_;
	my $body = join('', map { sprintf("%x\r\n%s\r\n", 250, 'a' x 250) } 1 .. $bytes / 250) . "0\r\n\r\n";
	my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1:' . $t->port(8080), Timeout => 5) or return '';
	$s->print('POST ' . ($path // '/up') . " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
		. "Transfer-Encoding: chunked\r\n\r\n$body");
	local $/;
	my $resp = <$s> // '';
	close $s;
	return $resp;
}

is(status_of(http_get($t->port(8080), '/up')), 200, 'a GET without a body passes');
is($fill->(), 0, 'and counts nothing');

is(status_of(chunked_post(1000)), 200, 'a chunked upload of 1,000 bytes passes');
ok($t->wait_for(sub { abs($fill->() - 1000) < 1 }, 2), 'its 1,000 bytes are charged once it is done')
	or diag('fill ' . $fill->());
is(status_of(chunked_post(1000)), 200, 'a second one passes');
is(status_of(http_request('POST', $t->port(8080), '/up', {}, 'b' x 1000)), 200,
	'an upload of 1,000 bytes with a Content-Length passes (counted at once)');
ok($t->wait_for(sub { abs($fill->() - 3000) < 1 }, 2), '3,000 bytes counted')
	or diag('fill ' . $fill->());
is(status_of(chunked_post(250)), 429, 'a chunked upload to the full quota is rejected before its body is read');
is(status_of(http_request('POST', $t->port(8080), '/up', {}, "b" x 10)), 429, 'so is one with a length');
cmp_ok(abs($fill->() - 3000), "<", 1, "rejected uploads count nothing");

# The shadow quota would refuse the second upload: it goes on, and its enforced parent
# still gets its bytes once they are known.
is(status_of(chunked_post(1000, '/sh')), 200, 'a chunked upload under a shadow quota');
ok($t->wait_for(sub { abs($fill->('all') - 1000) < 1 }, 2), 'its parent counts its bytes');
is(status_of(chunked_post(1000, '/sh')), 200, 'one the shadow quota would refuse goes on');
ok($t->wait_for(sub { abs($fill->('all') - 2000) < 1 }, 2), 'and its parent counts its bytes too')
	or diag('fill ' . $fill->('all'));

my $log = $t->read_file('info.log');
my $logged = () = $log =~ /yarl: the weight for quota "up" was empty before and after the request/g;
is($logged, 1, 'the GET without a body is logged once, at info');

$t->finish();
done_testing();
